#!/usr/bin/env bash
# The installed package: `cmake --install` of the build tree into a temporary prefix, then the example
# appliance (share/g4/examples/example_embed.c) built outside the tree with find_package(g4) (shared and
# static) and with pkg-config (g4.pc, g4-static.pc), each run on a plan the installed `g4` compiles; their
# output must equal the in-tree example's (all on one thread: no run depends on how work is shared out).
# libg4.so must export the C API (g4_*) and nothing else.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR IN_TREE_EXAMPLE
set -euo pipefail
build=$1 src=$2 in_tree=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/g4 include/g4/g4.h lib/libg4.so lib/libg4_runtime.a lib/cmake/g4/g4Config.cmake \
    lib/pkgconfig/g4.pc lib/pkgconfig/g4-static.pc share/g4/examples/example_embed.c; do
    [ -e "$prefix/$f" ] || { echo "install_test: $f is missing from the installed tree" >&2; exit 1; }
done
others=$(nm -D --defined-only "$prefix/lib/libg4.so" | awk '{print $3}' | grep -v '^g4_' || true)
[ -z "$others" ] || { echo "install_test: libg4.so exports symbols besides g4_*: $others" >&2; exit 1; }

# find_package(g4)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src/tests/install" -B "$tmp/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer" >/dev/null

# pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
example=$prefix/share/g4/examples/example_embed.c
cc -O1 -o "$tmp/embed_pc" "$example" $(pkg-config --cflags --libs g4) -Wl,-rpath,"$prefix/lib"
cc -O1 -o "$tmp/embed_pc_static" "$example" $(pkg-config --cflags --libs g4-static)
# (ldd's output is read whole: with pipefail, `ldd | grep -q` fails when grep exits before ldd has written all)
static_libs=$(ldd "$tmp/embed_pc_static")
if grep -q libg4 <<<"$static_libs"; then
    echo "install_test: the g4-static.pc program loads libg4.so" >&2
    exit 1
fi

"$prefix/bin/g4" compile --model "$src/tests/fixtures/e2b_tiny" --no-fidelity -o "$tmp/tiny.g4plan" >/dev/null
want=$(G4_THREADS=1 "$in_tree" "$tmp/tiny.g4plan" "hello world")
for exe in "$tmp/consumer/embed_shared" "$tmp/consumer/embed_static" "$tmp/embed_pc" "$tmp/embed_pc_static"; do
    got=$(G4_THREADS=1 "$exe" "$tmp/tiny.g4plan" "hello world")
    if [ "$got" != "$want" ]; then
        echo "install_test: $(basename "$exe") printed '$got', the in-tree example '$want'" >&2
        exit 1
    fi
done
shared_libs=$(ldd "$tmp/consumer/embed_shared")
grep -q "$prefix/lib/libg4.so.1" <<<"$shared_libs" || {
    echo "install_test: embed_shared does not load the installed libg4.so.1" >&2
    exit 1
}
echo "install_test: the installed package builds and runs the example (find_package, pkg-config; shared, static)"
