/* Separable resampling of uint8 RGB crops into a square output, with the `pytorch` pipeline's
 * filter rule: a 2-tap linear filter while the box is less than 2x the output on its shorter
 * side, an area (box-overlap) filter at >= 2x. Both use OpenCV's coordinate conventions
 * (INTER_LINEAR's half-pixel centres, INTER_AREA's overlap weights), in 14-bit fixed point, so
 * pixels stay within one grey level of cv2.resize's. */
#ifndef TT_RESAMPLE_H
#define TT_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* One axis: output d reads `count[d]` inputs from `start[d]` with `weight[d * max_taps + t]`. */
typedef struct {
    int out;
    int max_taps;
    int *start;
    int *count;
    int16_t *weight;
} tt_axis;

/* The horizontal pass's plan, the same for every row: per output position (flip applied), where
 * its first tap is in an intermediate row, how many tap pairs it has and their packed weights. */
typedef struct {
    int32_t *offset;      /* in uint16 units: 3 * first input pixel */
    int32_t *pairs;
    uint32_t *weights;    /* max_pairs per position: (w_2k | w_2k+1 << 16) */
    int max_pairs;
    size_t len;           /* positions allocated */
} tt_row_plan;

/* Scratch one thread reuses from sample to sample (grown on demand, never shrunk). */
typedef struct {
    tt_axis rows, cols;
    tt_row_plan plan;
    uint16_t *mid;        /* the vertical pass's output: out_h rows of in_w * 3 */
    size_t mid_len;
    int32_t *acc;         /* one row of the vertical pass's sums */
    size_t acc_len;
} tt_resampler;

void tt_resampler_free(tt_resampler *r);

/* Resizes the in_h x in_w RGB crop at `src` (row stride `src_stride` bytes) into the
 * out_h x out_w RGB image at `dst` (rows of out_w * 3 bytes), mirrored left-right if `flip`.
 * Returns 0, or -1 when memory runs out. */
int tt_resize(tt_resampler *r, const uint8_t *src, size_t src_stride, int in_h, int in_w,
              uint8_t *dst, int out_h, int out_w, int flip);

/* Copies (and mirrors, if `flip`) an out_h x out_w crop at `src` into `dst`. */
void tt_copy(const uint8_t *src, size_t src_stride, uint8_t *dst, int out_h, int out_w, int flip);

#endif
