/* A pool of decoding threads that never touch Python: batches go in as jobs, samples are
 * claimed one at a time by whichever thread is free, in job order. */
#ifndef TT_POOL_H
#define TT_POOL_H

#include <pthread.h>
#include <sys/types.h>

#include "sample.h"

typedef struct tt_job {
    tt_sample *samples;
    int n;
    int image_size;
    int small;
    uint8_t *out;              /* n slots of image_size^2 * 3 bytes */
    int next;                  /* the next sample to claim */
    int done;                  /* samples finished or skipped */
    int finished;
    int failures;              /* how many samples failed */
    uint8_t *failed;           /* per sample: 1 if it failed (n entries, caller-allocated) */
    char (*messages)[TT_MESSAGE_LEN];  /* per sample: why (n entries, caller-allocated) */
    struct tt_job *queue_next;
} tt_job;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    tt_job *head, *tail;       /* jobs with samples left to claim */
    int stop;
    int threads;
    int started;
    int full_decode;           /* tt_worker.full_decode for every thread */
    pthread_t *ids;
    pid_t owner;               /* a forked child must not touch its parent's threads */
    int64_t idle_ns;           /* summed over threads: time spent waiting for a sample */
} tt_pool;

int tt_pool_start(tt_pool *p, int threads, int full_decode);
/* Stops and joins the threads; cancels what is queued. Only in the process that started it. */
void tt_pool_stop(tt_pool *p);

/* Fills in the job's bookkeeping and queues it; the caller keeps `job` alive until it finished. */
void tt_pool_submit(tt_pool *p, tt_job *job);
/* Blocks until every sample of `job` is done (call without the GIL). */
void tt_pool_wait(tt_pool *p, tt_job *job);
/* Takes the job's unclaimed samples off the queue; claimed ones still finish (then wait). */
void tt_pool_cancel(tt_pool *p, tt_job *job);

/* Runs a job in the calling thread with its own worker (no pool). */
void tt_run_job(tt_worker *w, tt_job *job);

#endif
