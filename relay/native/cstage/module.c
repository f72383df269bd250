/* relay.native._cstage: the module (take, route_hits, Table, Tracker) and its initialisation.
 *
 * The extension is built from every .c file of relay/native/cstage/ (setup.py); the references of
 * its parts are named at the top of each of them.
 */
#include "pieces.h"
#include "urandom.h"

static PyMethodDef module_methods[] = {
    {"take", (PyCFunction)take, METH_VARARGS,
     "take(stage, entries, inputs, new_in, in_active, labels_of, tracker, gen) -> (pieces, kept, routed, "
     "[(reason, samples, series)]) or NotImplemented (the reference must run)"},
    {"route_hits", (PyCFunction)route_hits, METH_VARARGS,
     "route_hits(body, table, tracker_in, gen_in, stages, labels_of) -> (series, samples, histograms, "
     "exemplars, [metadata bytes], [(pieces, kept, routed, drops)] per stage) or NotImplemented: a request whose "
     "every series is a hit in the DecisionTable, routed without Python objects per series; stages: "
     "(shards, limited, owners dict, out tracker, gen) each"},
    {"hit_counts", (PyCFunction)hit_counts, METH_NOARGS,
     "hit_counts() -> (requests, series) routed by route_hits so far (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "relay.native._cstage",
    "The relay's per-series stateful pass in C (relay.cardinality, relay.stage use it).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cstage(void) {
    if (native_urandom(&t12_key, 8) < 0)
        return NULL;
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&TrackerType) < 0)
        return NULL;
    S_aggregated = PyUnicode_InternFromString("aggregated");
    S_too_far = PyUnicode_InternFromString("too_far_in_future");
    S_agg_histogram = PyUnicode_InternFromString("aggregate_histogram");
    S_collision = PyUnicode_InternFromString("collision");
    S_series_limit = PyUnicode_InternFromString("series_limit");
    if (!S_aggregated || !S_too_far || !S_agg_histogram || !S_collision || !S_series_limit)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    Py_INCREF(&TrackerType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0
        || PyModule_AddObject(m, "Tracker", (PyObject *)&TrackerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
