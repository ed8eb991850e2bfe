// Fuzz target: image decoding (runtime/src/media/image_io.h: PNG, BMP, GIF through stb_image, JPEG through
// libjpeg-turbo, PPM/PGM).
#include "runtime/src/media/image_io.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    g4::media::ImageRGB8 img;
    std::string err = g4::media::decode_image(data, size, "fuzz", &img);
    if (err.empty() &&
        (img.width <= 0 || img.height <= 0 || img.rgb.size() != (size_t)img.width * img.height * 3))
        std::abort(); // a decoded image must have the size it claims
    return 0;
}
