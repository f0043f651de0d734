// Reading the elements of an exact list or tuple of Python ints in compiled code.
//
// Part of the Cython binding, not of the core: it needs Python.h. Each loop
// converts a run of exact ints and returns the index of the first element it
// cannot take (not an exact int, or out of range), so the binding converts
// that one element by the library's rules (radixmeta/_keys.py) and resumes.
// No object is created and no Python code runs, so the list cannot change
// while a loop reads it.
#pragma once

#include <Python.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h>  // ob_digit; Python.h includes it from 3.11 on
#endif

// 1 with *out set when o is an exact int that fits in a long long, else 0
// (with no Python error left set).
static inline int rm_exact_int(PyObject* o, long long* out) {
  if (!PyLong_CheckExact(o)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
  if (PyUnstable_Long_IsCompact((PyLongObject*)o)) {
    *out = (long long)PyUnstable_Long_CompactValue((PyLongObject*)o);
    return 1;
  }
#else
  // Token ids and slot numbers are small: one 30-bit digit, read in place.
  const Py_ssize_t size = Py_SIZE(o);
  if (size == 0) {
    *out = 0;
    return 1;
  }
  if (size == 1) {
    *out = (long long)((PyLongObject*)o)->ob_digit[0];
    return 1;
  }
#endif
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0) return 0;
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  *out = v;
  return 1;
}

// Tokens: exact ints in [0, 2**32).
static inline Py_ssize_t rm_exact_tokens(PyObject* const* items, Py_ssize_t n, uint32_t* dst) {
  Py_ssize_t i = 0;
#if PY_VERSION_HEX < 0x030C0000
  // The common run first: ints of at most one 30-bit digit (every token id of a real
  // vocabulary), read without a call or a branch on the value. Size 0 is the int 0.
  for (; i < n; ++i) {
    PyObject* o = items[i];
    if (Py_TYPE(o) != &PyLong_Type) break;  // first: only an int has a size to read
    const Py_ssize_t size = Py_SIZE(o);
    if ((size_t)size > 1) break;
    dst[i] = (uint32_t)((PyLongObject*)o)->ob_digit[0] & (0u - (uint32_t)size);
  }
#endif
  for (; i < n; ++i) {
    long long v;
    if (!rm_exact_int(items[i], &v) || v < 0 || v > 0xFFFFFFFFLL) return i;
    dst[i] = (uint32_t)v;
  }
  return n;
}

// Slot values: exact ints in the int64 range.
static inline Py_ssize_t rm_exact_int64(PyObject* const* items, Py_ssize_t n, int64_t* dst) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v;
    if (!rm_exact_int(items[i], &v)) return i;
    dst[i] = (int64_t)v;
  }
  return n;
}

// Block hashes: exact ints in [-2**63, 2**63), negatives as two's complement;
// hashes of 2**63 and above stop the loop (the binding takes them one by one).
static inline Py_ssize_t rm_exact_hashes(PyObject* const* items, Py_ssize_t n, uint64_t* dst) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v;
    if (!rm_exact_int(items[i], &v)) return i;
    dst[i] = (uint64_t)v;
  }
  return n;
}
