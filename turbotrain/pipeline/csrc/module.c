/* turbotrain.pipeline._native: the compiled batch kernel behind cpu_decode.BatchDecoder.
 *
 *   pool = Pool(threads)                        # decoding threads that never take the GIL
 *   job = pool.submit(table, image_size, small, out, keep)
 *   job.wait()                                  # [(position, message)] of the samples that
 *                                               # failed, in batch order ([] when none did)
 *   Worker().run(table, image_size, small, out) # the same, in the calling thread, GIL released
 *   check_headers(table)                        # None, or (position, height, width) of the
 *                                               # first JPEG whose header lies: DALI's feed
 *   slot = guard_map(address, length, line)     # SIGBUS in that range: write line, exit 2
 *   unguard_map(slot)                           # (map_guard.c)
 *   guard_quietly(code)                         # in a worker: re-armed, exit `code`, silent
 *
 * `table` is a buffer of tt_sample records (SAMPLE_FIELDS gives their layout; cpu_decode builds
 * it with numpy, vectorised over the batch): where each sample's bytes are, its stored size and
 * mode, its crop box and flip. The caller guarantees the addresses point at live memory of the
 * stated sizes and passes what keeps it alive as `keep`; the job holds it until it finished. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "map_guard.h"
#include "pool.h"

#define MAX_THREADS 1024

/* -- sample tables ---------------------------------------------------------------------------- */
/* The job's per-sample arrays, in one allocation after the sample records. */
static void *job_arrays(tt_job *job, size_t samples_bytes) {
    size_t n = (size_t)job->n;
    uint8_t *block = PyMem_RawMalloc(samples_bytes + n * (1 + TT_MESSAGE_LEN) + 1);
    if (!block) return NULL;
    job->samples = (tt_sample *)block;
    job->messages = (char (*)[TT_MESSAGE_LEN])(block + samples_bytes);
    job->failed = block + samples_bytes + n * TT_MESSAGE_LEN;
    return block;
}

static int read_table(PyObject *table, tt_job *job) {
    Py_buffer view;
    if (PyObject_GetBuffer(table, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view.len % (Py_ssize_t)sizeof(tt_sample) || view.len / sizeof(tt_sample) > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "a sample table holds records of %zu bytes, not %zd bytes",
                     sizeof(tt_sample), view.len);
        PyBuffer_Release(&view);
        return -1;
    }
    job->n = (int)(view.len / (Py_ssize_t)sizeof(tt_sample));
    if (!job_arrays(job, (size_t)view.len)) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(job->samples, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return 0;
}

static int get_output(PyObject *out, Py_buffer *view, int n, int image_size) {
    if (image_size < 1 || image_size > 65535) {
        PyErr_Format(PyExc_ValueError, "image_size must be in 1..65535, not %d", image_size);
        return -1;
    }
    if (PyObject_GetBuffer(out, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t need = (Py_ssize_t)n * image_size * image_size * 3;
    if (view->len < need) {
        PyErr_Format(PyExc_ValueError, "the output buffer has %zd bytes, the batch needs %zd",
                     view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* [(position, message), ...] of the failed samples, in batch order (empty: all decoded). */
static PyObject *outcome(const tt_job *job) {
    PyObject *failures = PyList_New(0);
    for (int k = 0; failures && k < job->n && PyList_GET_SIZE(failures) < job->failures; k++) {
        if (!job->failed[k]) continue;
        PyObject *item = Py_BuildValue("(is)", k, job->messages[k]);
        if (!item || PyList_Append(failures, item) < 0) Py_CLEAR(failures);
        Py_XDECREF(item);
    }
    return failures;
}

/* -- Pool ------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    tt_pool pool;
    int open;
} PoolObject;

static int owned_here(PoolObject *self) {
    return self->open && self->pool.owner == getpid();
}

static int Pool_init(PoolObject *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"threads", "region", NULL};
    int threads, region = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|p", names, &threads, &region)) return -1;
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in 1..%d, not %d", MAX_THREADS, threads);
        return -1;
    }
    if (self->open) return 0;
    if (tt_pool_start(&self->pool, threads, !region)) {
        tt_pool_stop(&self->pool);
        PyErr_SetString(PyExc_OSError, "cannot start the decoding threads");
        return -1;
    }
    self->open = 1;
    return 0;
}

static void close_pool(PoolObject *self) {
    if (!owned_here(self)) {  /* closed, or a forked child: its parent's threads are not here */
        self->open = 0;
        return;
    }
    self->open = 0;
    Py_BEGIN_ALLOW_THREADS
    tt_pool_stop(&self->pool);
    Py_END_ALLOW_THREADS
}

static PyObject *Pool_close(PoolObject *self, PyObject *unused) {
    (void)unused;
    close_pool(self);
    Py_RETURN_NONE;
}

static void Pool_dealloc(PoolObject *self) {
    close_pool(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pool_threads(PoolObject *self, void *unused) {
    (void)unused;
    return PyLong_FromLong(self->open ? self->pool.threads : 0);
}

static PyObject *Pool_idle(PoolObject *self, void *unused) {
    (void)unused;
    if (!owned_here(self)) return PyFloat_FromDouble(0.0);
    pthread_mutex_lock(&self->pool.lock);
    int64_t idle = self->pool.idle_ns;
    pthread_mutex_unlock(&self->pool.lock);
    return PyFloat_FromDouble((double)idle / 1e9);
}

/* -- Job -------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    tt_job job;
    PoolObject *pool;
    Py_buffer out;
    PyObject *keep;
    int holding;        /* out and keep are held until the job finished */
} JobObject;

static PyTypeObject JobType;

/* Once finished: the output and what kept the inputs alive go; the per-sample outcomes stay
 * (wait() may be asked again) until the Job itself goes. */
static void let_go(JobObject *self) {
    if (!self->holding) return;
    self->holding = 0;
    PyBuffer_Release(&self->out);
    Py_CLEAR(self->keep);
}

/* Whether the pool finished the job; the pool's threads hold the lock only ~0.1 us and never
 * take the GIL, so asking with the GIL held cannot deadlock. */
static int finished_now(JobObject *self) {
    pthread_mutex_lock(&self->pool->pool.lock);
    int finished = self->job.finished;
    pthread_mutex_unlock(&self->pool->pool.lock);
    return finished;
}

static void finish(JobObject *self) {
    if (!self->holding) return;
    /* A finished batch is taken without letting the GIL go: beside a Python-busy thread, each
     * release costs the consumer up to the 5 ms switch interval to get it back. */
    if (self->pool->pool.owner == getpid() && !finished_now(self)) {
        Py_BEGIN_ALLOW_THREADS
        tt_pool_wait(&self->pool->pool, &self->job);
        Py_END_ALLOW_THREADS
    }
    let_go(self);
}

static PyObject *Job_wait(JobObject *self, PyObject *unused) {
    (void)unused;
    finish(self);
    return outcome(&self->job);
}

static PyObject *Job_cancel(JobObject *self, PyObject *unused) {
    (void)unused;
    if (self->holding && self->pool->pool.owner == getpid())
        tt_pool_cancel(&self->pool->pool, &self->job);
    finish(self);
    Py_RETURN_NONE;
}

static void Job_dealloc(JobObject *self) {
    if (self->holding && self->pool->pool.owner == getpid())
        tt_pool_cancel(&self->pool->pool, &self->job);
    finish(self);
    PyMem_RawFree(self->job.samples);  /* the block with the outcomes (job_arrays) */
    self->job.samples = NULL;
    Py_CLEAR(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pool_submit(PoolObject *self, PyObject *args) {
    PyObject *table, *out, *keep = Py_None;
    int image_size, small;
    if (!PyArg_ParseTuple(args, "OipO|O", &table, &image_size, &small, &out, &keep)) return NULL;
    if (!owned_here(self)) {
        PyErr_SetString(PyExc_RuntimeError, "this decoding pool is closed (or belongs to the "
                        "process this one was forked from)");
        return NULL;
    }
    JobObject *job = PyObject_New(JobObject, &JobType);
    if (!job) return NULL;
    memset(&job->job, 0, sizeof(job->job));
    job->pool = NULL;
    job->keep = NULL;
    job->holding = 0;
    if (read_table(table, &job->job)) {
        Py_DECREF(job);
        return NULL;
    }
    if (get_output(out, &job->out, job->job.n, image_size)) {
        PyMem_RawFree(job->job.samples);
        job->job.samples = NULL;
        Py_DECREF(job);
        return NULL;
    }
    Py_INCREF(self);
    job->pool = self;
    Py_INCREF(keep);
    job->keep = keep;
    job->holding = 1;
    job->job.image_size = image_size;
    job->job.small = small;
    job->job.out = job->out.buf;
    tt_pool_submit(&self->pool, &job->job);
    return (PyObject *)job;
}

static PyObject *Job_done(JobObject *self, void *unused) {
    (void)unused;
    if (!self->holding) Py_RETURN_TRUE;
    return PyBool_FromLong(finished_now(self));
}

/* -- Worker: one decoder handle for the calling thread ----------------------------------------- */
typedef struct {
    PyObject_HEAD
    tt_worker worker;
    int ready;
} WorkerObject;

static int Worker_init(WorkerObject *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"region", NULL};
    int region = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", names, &region)) return -1;
    if (self->ready) return 0;
    if (tt_worker_init(&self->worker)) {
        PyErr_SetString(PyExc_OSError, "cannot create a JPEG decoder");
        return -1;
    }
    self->worker.full_decode = !region;
    self->ready = 1;
    return 0;
}

static void Worker_dealloc(WorkerObject *self) {
    if (self->ready) tt_worker_free(&self->worker);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Worker_run(WorkerObject *self, PyObject *args) {
    PyObject *table, *out;
    int image_size, small;
    if (!PyArg_ParseTuple(args, "OipO", &table, &image_size, &small, &out)) return NULL;
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Worker() was not initialised");
        return NULL;
    }
    tt_job job;
    memset(&job, 0, sizeof(job));
    if (read_table(table, &job)) return NULL;
    Py_buffer view;
    if (get_output(out, &view, job.n, image_size)) {
        PyMem_RawFree(job.samples);
        return NULL;
    }
    job.image_size = image_size;
    job.small = small;
    job.out = view.buf;
    Py_BEGIN_ALLOW_THREADS
    tt_run_job(&self->worker, &job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *failures = outcome(&job);
    PyMem_RawFree(job.samples);  /* the outcomes live in the same block */
    return failures;
}

/* -- check_headers: DALI's feed ---------------------------------------------------------------- */
static PyObject *check_headers(PyObject *module, PyObject *table) {
    (void)module;
    tt_job job;
    memset(&job, 0, sizeof(job));
    if (read_table(table, &job)) return NULL;
    tt_sample *samples = job.samples;
    int n = job.n;
    tt_jpeg jpeg;
    if (tt_jpeg_init(&jpeg)) {
        PyMem_RawFree(samples);
        PyErr_SetString(PyExc_OSError, "cannot create a JPEG decoder");
        return NULL;
    }
    int bad = -1, height = 0, width = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int k = 0; k < n && bad < 0; k++) {
        const tt_sample *s = &samples[k];
        if (s->mode != TT_MODE_JPEG) continue;
        if (tt_jpeg_header_size(&jpeg, s->data, (size_t)s->size, &height, &width)) continue;
        if (height != s->height || width != s->width) bad = k;  /* unreadable: DALI says why */
    }
    Py_END_ALLOW_THREADS
    PyObject *result;
    if (bad < 0) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        result = Py_BuildValue("(iii)", bad, height, width);
    }
    tt_jpeg_free(&jpeg);
    PyMem_RawFree(samples);
    return result;
}

/* -- types and module ------------------------------------------------------------------------- */
static PyMethodDef Pool_methods[] = {
    {"submit", (PyCFunction)Pool_submit, METH_VARARGS,
     "submit(table, image_size, small, out, keep=None) -> Job: queue one batch."},
    {"close", (PyCFunction)Pool_close, METH_NOARGS,
     "Stops the threads (queued work is cancelled, running samples finish)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Pool_getset[] = {
    {"threads", (getter)Pool_threads, NULL, "decoding threads (0 once closed)", NULL},
    {"idle", (getter)Pool_idle, NULL, "seconds the threads, summed, waited for a sample to "
     "decode (a pool fed too slowly)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "turbotrain.pipeline._native.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pool(threads, region=True): decoding threads that run whole batches without the "
              "GIL. region=False decodes whole images and then crops (a benchmark comparison).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

static PyMethodDef Job_methods[] = {
    {"wait", (PyCFunction)Job_wait, METH_NOARGS,
     "Blocks (without the GIL) until the batch is written; [(position, message)] of the "
     "failed samples."},
    {"cancel", (PyCFunction)Job_cancel, METH_NOARGS,
     "Drops the samples not yet started and waits for the others."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Job_getset[] = {
    {"done", (getter)Job_done, NULL, "whether every sample is finished", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "turbotrain.pipeline._native.Job",
    .tp_basicsize = sizeof(JobObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One submitted batch.",
    .tp_dealloc = (destructor)Job_dealloc,
    .tp_methods = Job_methods,
    .tp_getset = Job_getset,
};

static PyObject *Worker_timing(WorkerObject *self, void *unused) {
    (void)unused;
    return Py_BuildValue("{s:L,s:L,s:L}", "samples", (long long)self->worker.samples,
                         "decode_ns", (long long)self->worker.decode_ns,
                         "resize_ns", (long long)self->worker.resize_ns);
}

static PyGetSetDef Worker_getset[] = {
    {"timing", (getter)Worker_timing, NULL,
     "{samples, decode_ns, resize_ns} this handle has run (resize_ns: resize, pad-crop, flip)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Worker_methods[] = {
    {"run", (PyCFunction)Worker_run, METH_VARARGS,
     "run(table, image_size, small, out) -> [(position, message)] of the failed samples, "
     "GIL released."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject WorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "turbotrain.pipeline._native.Worker",
    .tp_basicsize = sizeof(WorkerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Worker(region=True): a decoder handle for the calling thread.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Worker_init,
    .tp_dealloc = (destructor)Worker_dealloc,
    .tp_methods = Worker_methods,
    .tp_getset = Worker_getset,
};

static PyMethodDef module_methods[] = {
    {"check_headers", check_headers, METH_O,
     "check_headers(table) -> None, or (position, height, width) of the first JPEG whose "
     "header declares another size than its record."},
    {"guard_map", tt_guard_map, METH_VARARGS,
     "guard_map(address, length, line) -> slot: a SIGBUS at an address in the range writes "
     "`line` to stderr and exits 2 (-1: no free slot, unguarded)."},
    {"unguard_map", tt_unguard_map, METH_O, "unguard_map(slot): the range is no longer mapped."},
    {"guard_quietly", tt_guard_quietly, METH_O,
     "guard_quietly(code): re-arm the guard in a worker process; a fault exits `code`, silent."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native", "turbotrain's compiled batch decode kernel.", -1,
    module_methods, NULL, NULL, NULL, NULL};

static int add_layout(PyObject *m) {
    PyObject *fields = Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}",
        "data", (Py_ssize_t)offsetof(tt_sample, data),
        "size", (Py_ssize_t)offsetof(tt_sample, size),
        "height", (Py_ssize_t)offsetof(tt_sample, height),
        "width", (Py_ssize_t)offsetof(tt_sample, width),
        "top", (Py_ssize_t)offsetof(tt_sample, top),
        "left", (Py_ssize_t)offsetof(tt_sample, left),
        "box_h", (Py_ssize_t)offsetof(tt_sample, box_h),
        "box_w", (Py_ssize_t)offsetof(tt_sample, box_w),
        "mode", (Py_ssize_t)offsetof(tt_sample, mode),
        "flip", (Py_ssize_t)offsetof(tt_sample, flip));
    if (!fields || PyModule_AddObject(m, "SAMPLE_FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        return -1;
    }
    return PyModule_AddIntConstant(m, "SAMPLE_SIZE", (long)sizeof(tt_sample));
}

static int add_version(PyObject *m) {
#ifdef LIBJPEG_TURBO_VERSION
#define TT_STR2(x) #x
#define TT_STR(x) TT_STR2(x)
    const char *turbo = "libjpeg-turbo " TT_STR(LIBJPEG_TURBO_VERSION);
#else
    const char *turbo = "libjpeg (not libjpeg-turbo)";
#endif
    PyObject *text = PyUnicode_FromFormat("%s, API %d", turbo, JPEG_LIB_VERSION);
    if (!text || PyModule_AddObject(m, "LIBJPEG", text) < 0) {
        Py_XDECREF(text);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&PoolType) < 0 || PyType_Ready(&JobType) < 0 ||
        PyType_Ready(&WorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&PoolType);
    Py_INCREF(&JobType);
    Py_INCREF(&WorkerType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddObject(m, "Job", (PyObject *)&JobType) < 0 ||
        PyModule_AddObject(m, "Worker", (PyObject *)&WorkerType) < 0 ||
        PyModule_AddIntConstant(m, "MODE_JPEG", TT_MODE_JPEG) < 0 ||
        PyModule_AddIntConstant(m, "MODE_RAW", TT_MODE_RAW) < 0 || add_layout(m) < 0 ||
        add_version(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
