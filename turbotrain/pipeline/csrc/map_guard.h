/* SIGBUS in a registered memory map -> one line naming the file and exit 2 (map_guard.c). */
#ifndef TT_MAP_GUARD_H
#define TT_MAP_GUARD_H
#include <Python.h>

PyObject *tt_guard_map(PyObject *self, PyObject *args);
PyObject *tt_unguard_map(PyObject *self, PyObject *arg);
PyObject *tt_guard_quietly(PyObject *self, PyObject *arg);

#endif
