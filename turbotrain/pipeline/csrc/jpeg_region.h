/* Decoding a region of a JPEG with libjpeg-turbo: DCT-scaled, only the rows and iMCU columns
 * the region needs, errors returned as text instead of libjpeg's exit(). */
#ifndef TT_JPEG_REGION_H
#define TT_JPEG_REGION_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jpeglib.h>

#define TT_MESSAGE_LEN 200   /* libjpeg's JMSG_LENGTH_MAX */

typedef struct {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char message[TT_MESSAGE_LEN];
} tt_jpeg_errors;

/* One decoder handle; a thread owns one and reuses it for every sample. */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    tt_jpeg_errors errors;
    int ready;
    uint8_t *pixels;        /* the decoded region, rows of `stride` bytes */
    size_t pixels_len;
} tt_jpeg;

/* What tt_jpeg_decode_region hands back: the region's first pixel and its row stride. */
typedef struct {
    const uint8_t *pixels;
    size_t stride;
} tt_region;

int tt_jpeg_init(tt_jpeg *j);
void tt_jpeg_free(tt_jpeg *j);

/* Reads the header of the `size` bytes at `data` and checks it declares height x width. Then
 * decodes, at 1/factor scale (1, 2, 4, 8), the output rows [y0, y1) and columns [x0, x1) (in
 * scaled pixels) as RGB, using the fast integer IDCT. Returns 0 and fills `out`, or -1 with the
 * reason in j->errors.message. Whole-image decodes pass y0 = x0 = 0 and the scaled size. */
int tt_jpeg_decode_region(tt_jpeg *j, const uint8_t *data, size_t size, int height, int width,
                          int factor, int y0, int y1, int x0, int x1, tt_region *out);

/* The size the header declares, without decoding (returns 0), or -1 with the reason. */
int tt_jpeg_header_size(tt_jpeg *j, const uint8_t *data, size_t size, int *height, int *width);

#endif
