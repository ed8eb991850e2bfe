#!/usr/bin/env bash
# Builds the fuzz targets' seed corpora from the test fixtures (and the committed seeds in tests/fuzz/seeds):
# one folder per target under OUT. Multi-part inputs join their parts with a NUL byte, as the targets split
# them (tests/fuzz/fuzz_*.cpp). With G4_BINARY, only the plan seeds: compiled from the tiny fixtures.
# Usage: make_seeds.sh SOURCE_DIR OUT [G4_BINARY]
set -euo pipefail
src=$1 out=$2 g4=${3:-}
fx=$src/tests/fixtures

if [ -n "$g4" ]; then
    # plan: tiny CPU plans, text-only and with the tokenizer and both towers.
    rm -rf "$out/plan"
    mkdir -p "$out/plan"
    "$g4" compile --model "$fx/e2b_tiny_text" --max-context 16 --chunk 4 --logits-rows 2 --no-fidelity \
        -o "$out/plan/e2b_tiny_text.g4plan" >/dev/null
    "$g4" compile --model "$fx/e2b_tiny" --weights bf16 --max-context 32 --chunk 8 --image-tokens 70 \
        --max-audio-seconds 1 --no-fidelity -o "$out/plan/e2b_tiny.g4plan" >/dev/null
    touch "$out/plan/stamp"
    exit 0
fi

for t in safetensors config adapter tokenizer chat image wav media; do rm -rf "${out:?}/$t"; done
mkdir -p "$out"/{safetensors,config,adapter,tokenizer,chat,image,wav,media}
for t in chat image wav tokenizer; do cp "$src/tests/fuzz/seeds/$t/"* "$out/$t/"; done

# safetensors: the small fixture files (the large checkpoints' headers have the same form).
for f in $(find "$fx" -name '*.safetensors' -size -64k | sort); do
    cp "$f" "$out/safetensors/$(echo "${f#"$fx"/}" | tr / _)"
done

# config: config.json NUL generation_config.json of every checkpoint fixture, and config.json alone.
for d in "$fx"/e2b_tiny "$fx"/e2b_tiny_text "$fx"/e2b_tiny_mm "$fx"/e2b_tiny_bnb4 "$fx"/e4b_tiny; do
    n=$(basename "$d")
    cp "$d/config.json" "$out/config/$n"
    { cat "$d/config.json"; printf '\0'; cat "$d/generation_config.json"; } >"$out/config/$n.gen"
done

# adapter: adapter_config.json NUL adapter_model.safetensors of every adapter fixture that has both.
for d in "$fx"/adapters/*/; do
    [ -f "$d/adapter_model.safetensors" ] || continue
    { cat "$d/adapter_config.json"; printf '\0'; cat "$d/adapter_model.safetensors"; } >"$out/adapter/$(basename "$d")"
done

# tokenizer: tokenizer.json alone (a fixed sentence is encoded) and with texts from the test cases.
tj=$fx/tokenizer/tiny/tokenizer.json
cp "$tj" "$out/tokenizer/tiny"
{ cat "$tj"; printf '\0'; printf ' Hello  world\n\n<start_of_turn>user caf\xc3\xa9 \xe2\x96\x81x \xf0\x9f\x98\x80 \xc3'; } >"$out/tokenizer/tiny.text"

# image: the small fixture PNGs besides the committed seeds (every format stb_image is built with).
for f in "$fx"/towers/image/*.png; do
    if [ "$(stat -c %s "$f")" -lt 40000 ]; then cp "$f" "$out/image/"; fi
done

# wav: the fixture clips besides the committed seeds.
cp "$fx"/towers/audio/*.wav "$out/wav/"

# media: the compressed audio and video fixtures (FFmpeg's containers and codecs).
for f in "$fx"/towers/audio_files/*.{m4a,mp3,ogg,wav,flac} "$fx"/towers/video/*.{mp4,webm}; do cp "$f" "$out/media/"; done

touch "$out/stamp"
