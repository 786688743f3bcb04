/* One sample, from its stored bytes to its S x S x 3 slot of the batch: the per-sample work of
 * cpu_decode.BatchDecoder, with no Python in it. */
#ifndef TT_SAMPLE_H
#define TT_SAMPLE_H

#include <stdint.h>

#include "jpeg_region.h"
#include "resample.h"

#define TT_MODE_JPEG 0   /* datasets/beton/layout.py MODE_JPEG, MODE_RAW */
#define TT_MODE_RAW 1

/* Where a sample's bytes are and what to make of it (augment.CropBoxes' row). */
typedef struct {
    const uint8_t *data;
    int64_t size;
    int32_t height, width;
    int32_t top, left, box_h, box_w;
    uint8_t mode, flip;
} tt_sample;

/* What one decoding thread owns: its libjpeg handle and scratch, reused for every sample. */
typedef struct {
    tt_jpeg jpeg;
    tt_resampler resampler;
    uint8_t *square;      /* small images: the image resized to S x S before the pad-crop */
    size_t square_len;
    /* Where this worker's time went (CLOCK_MONOTONIC, ~25 ns a reading against ~600 us a
     * sample): bench/bench_kernel.py reads them to split a sample into decode and resize. */
    int64_t decode_ns, resize_ns, samples;
    int full_decode;      /* decode whole images, then crop: bench_kernel's comparison only */
} tt_worker;

int tt_worker_init(tt_worker *w);
void tt_worker_free(tt_worker *w);

/* Writes sample `s` into `out` (image_size^2 * 3 bytes). `small` selects the small-image path
 * (resize to S, reflect-pad, crop; augment.PAD_CROP / IDENTITY) over the cropped one
 * (RESIZED_CROP / CENTRE_CROP). Returns 0, or -1 with the reason in `message`. */
int tt_run_sample(tt_worker *w, const tt_sample *s, int image_size, int small, uint8_t *out,
                  char message[TT_MESSAGE_LEN]);

#endif
