/* A memory-mapped dataset file that shrinks while it is read (rewritten, truncated, a cache
 * evicting it) makes the next read of a page past its new end raise SIGBUS: by default the
 * process dies without a word, and Python cannot handle a synchronous SIGBUS (its handlers run
 * later, in the main thread; the fault repeats first). The reader registers each map it makes
 * (address range + one precomputed line naming the file); this process-wide SIGBUS handler,
 * when the faulting address lies in a registered range, writes that line and _exits(2), doing
 * only async-signal-safe things (atomic loads, write, _exit). A fault anywhere else goes to the
 * handler that was there before (the default: a core dump), exactly as if we were not here.
 * Works for every reader: numpy views in Python threads and the decode kernel's C threads. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "map_guard.h"

#define TT_GUARD_SLOTS 4096
#define TT_GUARD_MESSAGE 1024

typedef struct {
    _Atomic uintptr_t start, end; /* end == 0: a free slot */
    size_t length;
    char message[TT_GUARD_MESSAGE];
} tt_guard;

static tt_guard guards[TT_GUARD_SLOTS];
static _Atomic int guards_used; /* slots below this index may be live */
static struct sigaction previous;
static int installed;
/* In a worker process whose parent reports its end (guard_quietly): exit with this code and
 * write nothing, so the user reads one line, the parent's. 0: write the line, exit 2. */
static volatile sig_atomic_t quiet_code;

static void on_sigbus(int signum, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    int used = atomic_load(&guards_used);
    for (int i = 0; i < used; i++) {
        uintptr_t start = atomic_load(&guards[i].start), end = atomic_load(&guards[i].end);
        if (end != 0 && address >= start && address < end) {
            if (quiet_code) _exit(quiet_code);
            ssize_t written = write(2, guards[i].message, guards[i].length);
            (void)written;
            _exit(2);
        }
    }
    /* Not ours: the previous handler takes it. A fault returns to the instruction, which
     * faults again under it; a SIGBUS sent by kill() does not repeat, so send it again. */
    sigaction(SIGBUS, &previous, NULL);
    if (info->si_code <= 0) raise(signum);
}

static int install(void) {
    if (installed) return 0;
    struct sigaction action, current;
    /* Already ours (a forked child re-arming): keep `previous`, or a fault that is not ours
     * would be handed back to this same handler for ever. */
    if (sigaction(SIGBUS, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == on_sigbus) {
        installed = 1;
        return 0;
    }
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous) != 0) return -1;
    installed = 1;
    return 0;
}

/* guard_map(address, length, message) -> slot (or -1 when every slot is taken: unguarded). */
PyObject *tt_guard_map(PyObject *self, PyObject *args) {
    unsigned long long address, length;
    const char *message;
    Py_ssize_t message_length;
    if (!PyArg_ParseTuple(args, "KKy#", &address, &length, &message, &message_length))
        return NULL;
    if (message_length >= TT_GUARD_MESSAGE) message_length = TT_GUARD_MESSAGE - 1;
    if (install() != 0) return PyErr_SetFromErrno(PyExc_OSError);
    /* Called with the GIL held, so registrations never race each other; the handler only
     * reads a slot once its end is stored (last, after the message). */
    for (int i = 0; i < TT_GUARD_SLOTS; i++) {
        if (atomic_load(&guards[i].end) != 0) continue;
        memcpy(guards[i].message, message, (size_t)message_length);
        guards[i].length = (size_t)message_length;
        atomic_store(&guards[i].start, (uintptr_t)address);
        atomic_store(&guards[i].end, (uintptr_t)(address + length));
        if (i >= atomic_load(&guards_used)) atomic_store(&guards_used, i + 1);
        return PyLong_FromLong(i);
    }
    return PyLong_FromLong(-1);
}

/* unguard_map(slot): the map is gone; its range may be reused by an unrelated mapping. */
PyObject *tt_unguard_map(PyObject *self, PyObject *arg) {
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    if (slot >= 0 && slot < TT_GUARD_SLOTS) atomic_store(&guards[slot].end, 0);
    Py_RETURN_NONE;
}

/* guard_quietly(code): in this process (a pipeline worker), put our handler back on top of
 * the one installed since (torch's worker handler prints a misleading shared-memory hint) and
 * exit with `code`, silently, on a fault in a registered map. */
PyObject *tt_guard_quietly(PyObject *self, PyObject *arg) {
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    installed = 0;
    if (install() != 0) return PyErr_SetFromErrno(PyExc_OSError);
    quiet_code = (sig_atomic_t)code;
    Py_RETURN_NONE;
}
