/* A per-process secret for the extensions' hash tables (relay.native._cstage's table key,
   relay.native._cdcache's SipHash key), drawn from os.urandom when a module is imported.

   Keys a client chooses (label bytes, series ids) must not aim at one bucket: the tables mix this
   secret in. Python's own os.urandom is the reference: the bytes come from it. */
#ifndef GPU_RELAY_URANDOM_H
#define GPU_RELAY_URANDOM_H

#include <Python.h>
#include <string.h>

/* n bytes of os.urandom(n) into out; -1 with an exception */
static inline int native_urandom(void *out, int n) {
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL)
        return -1;
    PyObject *rnd = PyObject_CallMethod(os, "urandom", "i", n);
    Py_DECREF(os);
    if (rnd == NULL)
        return -1;
    if (!PyBytes_Check(rnd) || PyBytes_GET_SIZE(rnd) != n) {
        Py_DECREF(rnd);
        PyErr_Format(PyExc_RuntimeError, "os.urandom(%d) did not return %d bytes", n, n);
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(rnd), (size_t)n);
    Py_DECREF(rnd);
    return 0;
}

#endif /* GPU_RELAY_URANDOM_H */
