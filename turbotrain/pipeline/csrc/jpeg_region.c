/* libjpeg-turbo region decode (see jpeg_region.h).
 *
 * Speed: jpeg_skip_scanlines() above the region still entropy-decodes those rows (Huffman codes
 * are sequential) but skips their IDCT, upsampling and colour conversion; jpeg_crop_scanline()
 * limits all three to the iMCU columns the region touches; rows below it are never read. An
 * average RandomResizedCrop box covers about half the image, so the decode costs less than a full
 * one (the numbers are in docs/ARCHITECTURE.md, "Decode").
 *
 * Safety: libjpeg's default error handler calls exit(); ours longjmps back here with the
 * message. Warnings (corrupt or truncated data, which libjpeg would paper over with grey) are
 * errors too, as TurboJPEG reports them. Damage in rows below the region goes unseen when the
 * data ends in an EOI marker (a truncated file does not, and is decoded to its end);
 * `turbotrain verify` decodes every image whole. A progress monitor caps the number of scans, since a
 * progressive file of thousands of tiny scans would otherwise take minutes (djpeg's -maxscans).
 * The sizes were checked against the split's metadata, which caps them at 100 Mpx.
 *
 * History: libjpeg keeps an image's quantization and Huffman tables in the decompress object
 * for the next one (abbreviated streams rely on that), so a damaged file lacking its DQT
 * decoded with the previous sample's tables on one thread and failed on a fresh one: whether a
 * sample decoded depended on which samples its thread had met before. Each image starts from
 * a fresh object instead, at no measurable cost (a 32 px JPEG: 11.1 us a sample before, 11.2
 * after, best of three runs each). */
#include "jpeg_region.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SCANS 500
/* libjpeg's own allocations for one image (coefficient buffers of progressive files). */
#define MAX_DECODER_MEMORY (1024L * 1024L * 1024L)

static void on_error(j_common_ptr cinfo) {
    tt_jpeg_errors *e = (tt_jpeg_errors *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->message);
    longjmp(e->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) on_error(cinfo);  /* a warning: the data is damaged */
}

static void on_output(j_common_ptr cinfo) {
    (void)cinfo;  /* never print to stderr */
}

static void on_progress(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > MAX_SCANS) {
        tt_jpeg_errors *e = (tt_jpeg_errors *)cinfo->err;
        snprintf(e->message, TT_MESSAGE_LEN, "more than %d progressive scans", MAX_SCANS);
        longjmp(e->jump, 1);
    }
}

int tt_jpeg_init(tt_jpeg *j) {
    memset(j, 0, sizeof(*j));
    j->cinfo.err = jpeg_std_error(&j->errors.pub);
    j->errors.pub.error_exit = on_error;
    j->errors.pub.emit_message = on_message;
    j->errors.pub.output_message = on_output;
    if (setjmp(j->errors.jump)) return -1;
    jpeg_create_decompress(&j->cinfo);
    j->errors.progress.progress_monitor = on_progress;
    j->cinfo.progress = &j->errors.progress;
    j->ready = 1;
    return 0;
}

void tt_jpeg_free(tt_jpeg *j) {
    if (j->ready) jpeg_destroy_decompress(&j->cinfo);
    free(j->pixels);
    memset(j, 0, sizeof(*j));
}

/* Forgets every table an earlier image left (see "History" above). Runs under the caller's
 * setjmp: jpeg_create_decompress fails only when out of memory. */
static void forget_earlier_images(tt_jpeg *j) {
    jpeg_destroy_decompress(&j->cinfo);
    j->ready = 0;
    jpeg_create_decompress(&j->cinfo);
    j->cinfo.progress = &j->errors.progress;
    j->ready = 1;
}

static int read_header(tt_jpeg *j, const uint8_t *data, size_t size) {
    j_decompress_ptr c = &j->cinfo;
    forget_earlier_images(j);
    jpeg_mem_src(c, (unsigned char *)data, (unsigned long)size);
    c->mem->max_memory_to_use = MAX_DECODER_MEMORY;
    return jpeg_read_header(c, TRUE) == JPEG_HEADER_OK ? 0 : -1;
}

int tt_jpeg_header_size(tt_jpeg *j, const uint8_t *data, size_t size, int *height, int *width) {
    if (setjmp(j->errors.jump)) {
        jpeg_abort_decompress(&j->cinfo);
        return -1;
    }
    if (read_header(j, data, size)) {
        snprintf(j->errors.message, TT_MESSAGE_LEN, "no image in the JPEG data");
        jpeg_abort_decompress(&j->cinfo);
        return -1;
    }
    *height = (int)j->cinfo.image_height;
    *width = (int)j->cinfo.image_width;
    jpeg_abort_decompress(&j->cinfo);
    return 0;
}

static int fail(tt_jpeg *j, const char *why) {
    snprintf(j->errors.message, TT_MESSAGE_LEN, "%s", why);
    jpeg_abort_decompress(&j->cinfo);
    return -1;
}

int tt_jpeg_decode_region(tt_jpeg *j, const uint8_t *data, size_t size, int height, int width,
                          int factor, int y0, int y1, int x0, int x1, tt_region *out) {
    j_decompress_ptr c = &j->cinfo;
    if (setjmp(j->errors.jump)) {
        jpeg_abort_decompress(c);
        return -1;
    }
    if (read_header(j, data, size)) return fail(j, "no image in the JPEG data");
    if ((int)c->image_height != height || (int)c->image_width != width) {
        snprintf(j->errors.message, TT_MESSAGE_LEN,
                 "its JPEG header declares %ux%u pixels, the metadata %dx%d",
                 c->image_width, c->image_height, width, height);
        jpeg_abort_decompress(c);
        return -1;
    }
    if (c->jpeg_color_space != JCS_YCbCr && c->jpeg_color_space != JCS_RGB &&
        c->jpeg_color_space != JCS_GRAYSCALE)
        return fail(j, "its colour space is not RGB, YCbCr or greyscale");
    c->out_color_space = JCS_RGB;
    c->dct_method = JDCT_IFAST;   /* TJFLAG_FASTDCT, as cpu_decode.DECODE_OPTIONS */
    c->scale_num = 1;
    c->scale_denom = (unsigned int)factor;
    jpeg_start_decompress(c);
    int full_w = (int)c->output_width, full_h = (int)c->output_height;
    if (y0 < 0 || x0 < 0 || y1 > full_h || x1 > full_w || y0 >= y1 || x0 >= x1)
        return fail(j, "the crop box lies outside the scaled image");
    /* Fancy upsampling blends each chroma sample with its neighbours, which a crop starting at
     * x0 or ending at x1 lacks: decode one iMCU further on each side (max_h_samp_factor * 8
     * scaled pixels is at least one at any scale), so the region equals a full decode's. */
    int margin = c->max_h_samp_factor * 8;
    int left = x0 > margin ? x0 - margin : 0;
    int right = x1 + margin < full_w ? x1 + margin : full_w;
    JDIMENSION xoff = (JDIMENSION)left, cols = (JDIMENSION)(right - left);
    if (cols < (JDIMENSION)full_w) jpeg_crop_scanline(c, &xoff, &cols);  /* widens to iMCUs */
    else xoff = 0;
    size_t stride = (size_t)c->output_width * 3;
    size_t need = stride * (size_t)(y1 - y0 + 1);  /* + the spare row (below) */
    if (need > j->pixels_len) {
        uint8_t *bigger = realloc(j->pixels, need);
        if (!bigger) return fail(j, "out of memory for the decoded rows");
        j->pixels = bigger;
        j->pixels_len = need;
    }
    if (y0 > 0) jpeg_skip_scanlines(c, (JDIMENSION)y0);
    while ((int)c->output_scanline < y1) {
        JSAMPROW row = j->pixels + stride * (c->output_scanline - (JDIMENSION)y0);
        if (jpeg_read_scanlines(c, &row, 1) != 1) return fail(j, "the JPEG data ends early");
    }
    if (size < 2 || data[size - 2] != 0xFF || data[size - 1] != 0xD9) {
        /* No EOI marker at the end: truncated, or trailing bytes after the image. Entropy-decode
         * to the end as a full decode would, so a truncated file fails whatever region is asked
         * for (only such files pay; prepare-dataset's JPEGs end in EOI). Skipping the last row
         * too would be a no-op (libjpeg-turbo does not decode a skip to the bottom), so that
         * one is read into the spare row after the region. */
        JDIMENSION left_over = c->output_height - c->output_scanline;
        if (left_over > 1) jpeg_skip_scanlines(c, left_over - 1);
        if (left_over > 0) {
            JSAMPROW spare = j->pixels + stride * (size_t)(y1 - y0);
            if (jpeg_read_scanlines(c, &spare, 1) != 1) return fail(j, "the JPEG data ends early");
        }
        jpeg_finish_decompress(c);
    }
    jpeg_abort_decompress(c);  /* otherwise rows below the region are never decoded */
    out->pixels = j->pixels + 3 * (size_t)((JDIMENSION)x0 - xoff);
    out->stride = stride;
    return 0;
}
