/* The per-sample kernel (see sample.h): the same steps, in the same order and with the same
 * rounding of the crop box, as cpu_decode's Python path, so both make the same crops. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SMALL_PADDING 2  /* augment.SMALL_IMAGE_PADDING */

int tt_worker_init(tt_worker *w) {
    memset(w, 0, sizeof(*w));
    return tt_jpeg_init(&w->jpeg);
}

void tt_worker_free(tt_worker *w) {
    tt_jpeg_free(&w->jpeg);
    tt_resampler_free(&w->resampler);
    free(w->square);
    memset(w, 0, sizeof(*w));
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int say(char message[TT_MESSAGE_LEN], const char *why) {
    snprintf(message, TT_MESSAGE_LEN, "%s", why);
    return -1;
}

/* The largest power-of-two DCT scale (8, 4, 2) at which the box still covers the output
 * (cpu_decode._DCT_FACTORS: the M/8 factors between them decode slower than full size). */
static int dct_factor(const tt_sample *s, int image_size) {
    static const int factors[] = {8, 4, 2};
    for (int k = 0; k < 3; k++)
        if (s->box_h >= factors[k] * image_size && s->box_w >= factors[k] * image_size)
            return factors[k];
    return 1;
}

static int raw_fits(const tt_sample *s) {
    return s->size >= (int64_t)s->height * s->width * 3;
}

/* Photo-sized samples: decode the box's region (DCT-scaled), resize it into `out`, flip. */
static int cropped(tt_worker *w, const tt_sample *s, int image_size, uint8_t *out,
                   char message[TT_MESSAGE_LEN]) {
    int factor = s->mode == TT_MODE_RAW ? 1 : dct_factor(s, image_size);
    int height = (s->height + factor - 1) / factor, width = (s->width + factor - 1) / factor;
    double sy = (double)height / s->height, sx = (double)width / s->width;
    /* cpu_decode._cropped: y0 = int(top * sy), y1 = min(max(y0 + 1, round(...)), height);
     * nearbyint rounds half to even, as Python's round does. */
    int y0 = (int)(s->top * sy), x0 = (int)(s->left * sx);
    int y1 = (int)nearbyint((s->top + s->box_h) * sy), x1 = (int)nearbyint((s->left + s->box_w) * sx);
    if (y1 < y0 + 1) y1 = y0 + 1;
    if (x1 < x0 + 1) x1 = x0 + 1;
    if (y1 > height) y1 = height;
    if (x1 > width) x1 = width;
    if (s->top < 0 || s->left < 0 || y0 >= y1 || x0 >= x1)
        return say(message, "its crop box lies outside the image");
    tt_region region;
    int64_t started = now_ns();
    if (s->mode == TT_MODE_RAW) {
        if (!raw_fits(s)) return say(message, "fewer raw bytes than its size needs");
        region.stride = (size_t)s->width * 3;
        region.pixels = s->data + (size_t)y0 * region.stride + (size_t)x0 * 3;
    } else if (w->full_decode) {
        if (tt_jpeg_decode_region(&w->jpeg, s->data, (size_t)s->size, s->height, s->width,
                                  factor, 0, height, 0, width, &region)) {
            memcpy(message, w->jpeg.errors.message, TT_MESSAGE_LEN);
            return -1;
        }
        region.pixels += (size_t)y0 * region.stride + (size_t)x0 * 3;
    } else if (tt_jpeg_decode_region(&w->jpeg, s->data, (size_t)s->size, s->height, s->width,
                                     factor, y0, y1, x0, x1, &region)) {
        memcpy(message, w->jpeg.errors.message, TT_MESSAGE_LEN);
        return -1;
    }
    int64_t decoded = now_ns();
    if (tt_resize(&w->resampler, region.pixels, region.stride, y1 - y0, x1 - x0, out,
                  image_size, image_size, s->flip))
        return say(message, "out of memory while resizing");
    w->decode_ns += decoded - started;
    w->resize_ns += now_ns() - decoded;
    return 0;
}

/* cv2.BORDER_REFLECT_101 (torch's and numpy's "reflect"): -1 -> 1, n -> n - 2. */
static int reflect(int i, int n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return i;
}

/* Small samples: the whole image (resized to S x S when it is not), then the box of the image
 * reflect-padded by SMALL_PADDING (top, left may be negative), then the flip. */
static int small_image(tt_worker *w, const tt_sample *s, int image_size, uint8_t *out,
                       char message[TT_MESSAGE_LEN]) {
    const uint8_t *pixels;
    size_t stride;
    int64_t started = now_ns();
    if (s->mode == TT_MODE_RAW) {
        if (!raw_fits(s)) return say(message, "fewer raw bytes than its size needs");
        pixels = s->data;
        stride = (size_t)s->width * 3;
    } else {
        tt_region region;
        if (tt_jpeg_decode_region(&w->jpeg, s->data, (size_t)s->size, s->height, s->width, 1,
                                  0, s->height, 0, s->width, &region)) {
            memcpy(message, w->jpeg.errors.message, TT_MESSAGE_LEN);
            return -1;
        }
        pixels = region.pixels;
        stride = region.stride;
    }
    int n = image_size;
    size_t row = (size_t)n * 3;
    int64_t decoded = now_ns();
    w->decode_ns += decoded - started;
    if (s->height != n || s->width != n) {
        if (w->square_len < row * n) {
            uint8_t *bigger = realloc(w->square, row * n);
            if (!bigger) return say(message, "out of memory while resizing");
            w->square = bigger;
            w->square_len = row * n;
        }
        if (tt_resize(&w->resampler, pixels, stride, s->height, s->width, w->square, n, n, 0))
            return say(message, "out of memory while resizing");
        pixels = w->square;
        stride = row;
    }
    if (s->box_h != n || s->box_w != n || s->top < -SMALL_PADDING || s->top > SMALL_PADDING ||
        s->left < -SMALL_PADDING || s->left > SMALL_PADDING)
        return say(message, "its crop box is not a padded crop of the image");
    if (s->top == 0 && s->left == 0) {
        tt_copy(pixels, stride, out, n, n, s->flip);
    } else {
        for (int y = 0; y < n; y++) {
            const uint8_t *src = pixels + (size_t)reflect(s->top + y, n) * stride;
            uint8_t *dst = out + (size_t)y * row;
            for (int x = 0; x < n; x++) {
                int from = reflect(s->left + x, n);
                memcpy(dst + 3 * (s->flip ? n - 1 - x : x), src + 3 * from, 3);
            }
        }
    }
    w->resize_ns += now_ns() - decoded;
    return 0;
}

int tt_run_sample(tt_worker *w, const tt_sample *s, int image_size, int small, uint8_t *out,
                  char message[TT_MESSAGE_LEN]) {
    if (s->height <= 0 || s->width <= 0) return say(message, "it has no pixels");
    if (s->mode != TT_MODE_JPEG && s->mode != TT_MODE_RAW)
        return say(message, "unknown storage mode");
    w->samples++;
    return small ? small_image(w, s, image_size, out, message)
                 : cropped(w, s, image_size, out, message);
}
