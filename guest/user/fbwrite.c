/* Composites a window into a frame buffer, frame after frame: the guest
 * side of `faultline bench fastpf` (seed 001's x11perf -comppixwin500
 * case). The frame buffer is W x H pixels of 4 bytes (1920x1080 by
 * default, 8 MiB); each frame writes every pixel of an S x S window (500
 * by default) at a position that moves diagonally, as a compositor
 * redraws a moving window. The VMM harvests the frame buffer's dirty
 * pages as a display does, so each frame's first write to a page faults
 * (write-protected for dirty logging). It reports
 * `fbwrite_frames=N fbwrite_pixels=P fbwrite_ns=T` at the end, T in the
 * guest's clock. */
#include "ulib.h"

#define MAX_SIDE 8192
#define MAX_FRAMES 1000000

int fbwrite_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: fbwrite [-w width] [-h height] [-s window side] [-f frames]\n"
            "       (sides 16 to %d pixels, the window inside the buffer; frames 1 to %d)\n",
            MAX_SIDE, MAX_FRAMES);
    return 2;
}

int fbwrite_main(int argc, char **argv) {
    uint64_t width = 1920, height = 1080, side = 500, frames = 60;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-w") == 0)
            rc = opt_size("fbwrite", argc, argv, &i, 16, MAX_SIDE, &width);
        else if (strcmp(argv[i], "-h") == 0)
            rc = opt_size("fbwrite", argc, argv, &i, 16, MAX_SIDE, &height);
        else if (strcmp(argv[i], "-s") == 0)
            rc = opt_size("fbwrite", argc, argv, &i, 16, MAX_SIDE, &side);
        else if (strcmp(argv[i], "-f") == 0)
            rc = opt_size("fbwrite", argc, argv, &i, 1, MAX_FRAMES, &frames);
        if (rc < 0)
            return usage();
    }
    if (side > width || side > height)
        return usage();
    uint32_t *fb = mmap_anon(width * height * 4);
    if (!fb) {
        eprintf("fbwrite: cannot map %lu bytes\n", width * height * 4);
        return 1;
    }
    uint64_t start = time_ns();
    uint64_t pixels = 0;
    for (uint64_t f = 0; f < frames; f++) {
        /* The window's corner walks the free diagonal and back. */
        uint64_t span_x = width - side + 1, span_y = height - side + 1;
        uint64_t x0 = (f * 37) % span_x, y0 = (f * 23) % span_y;
        uint32_t colour = 0xff000000u | (uint32_t)(f * 0x010203u);
        for (uint64_t y = y0; y < y0 + side; y++) {
            uint32_t *row = &fb[y * width + x0];
            for (uint64_t x = 0; x < side; x++)
                row[x] = colour ^ (uint32_t)x;
        }
        pixels += side * side;
    }
    uint64_t elapsed = time_ns() - start;
    /* Check the last frame's window: the writes landed. */
    uint64_t f = frames - 1;
    uint64_t x0 = (f * 37) % (width - side + 1), y0 = (f * 23) % (height - side + 1);
    uint32_t colour = 0xff000000u | (uint32_t)(f * 0x010203u);
    for (uint64_t y = y0; y < y0 + side; y++)
        for (uint64_t x = 0; x < side; x++)
            if (fb[y * width + x0 + x] != (colour ^ (uint32_t)x)) {
                eprintf("fbwrite: pixel (%lu, %lu) lost its value\n", x0 + x, y);
                return 1;
            }
    report("fbwrite_frames=%lu fbwrite_pixels=%lu fbwrite_ns=%lu", frames, pixels, elapsed);
    printf("fbwrite: %lu frames of %lux%lu in a %lux%lu buffer, %lu ns\n", frames, side, side, width,
           height, elapsed);
    return 0;
}
