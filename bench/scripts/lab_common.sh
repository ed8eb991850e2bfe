# Steps shared by the decode labs (ab_env.sh, ab_plans.sh, trace_lab.sh, trace_ab.sh and
# bench/e2e/e2e_run.sh): source it from the repository root. Settings, all optional:
#   BUILD       the build folder the labs configure and build (default build-bench)
#   CMAKE_ARGS  extra arguments for its cmake configure (e.g. -DCMAKE_PREFIX_PATH=DIR for the header-only deps)
#   WORK        where the random-weight real-shape checkpoints and the lab plans go (default /tmp/g4bench)
#   OUT         where the result files go (default bench-out); created if missing
#   JOBS        build parallelism (default: every core)
# Each function exits the calling script on failure, after printing the tail of its log. The checkpoints are
# made by bench/e2e/e2e_bench.py with transformers (torch with CUDA, transformers, peft importable).
BUILD=${BUILD:-build-bench}
WORK=${WORK:-/tmp/g4bench}
OUT=${OUT:-bench-out}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$WORK"

# lab_build LOGTAG [TARGETS...]: configure and build $BUILD here (default target g4).
lab_build() {
    local tag=$1
    shift
    cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DG4_BUILD_TESTS=OFF ${CMAKE_ARGS:-} > $WORK/${tag}_cmake.log 2>&1 &&
        cmake --build $BUILD -j$JOBS --target "${@:-g4}" > $WORK/${tag}_build.log 2>&1 || { tail -30 $WORK/${tag}_build.log; exit 1; }
}

# lab_checkpoint MODEL LOG: the random-weight real-shape checkpoint $WORK/MODEL, made once.
lab_checkpoint() {
    [ -f $WORK/$1/config.json ] && return
    python3 bench/e2e/e2e_bench.py $BUILD/tools/g4 --model $1 --workdir $WORK --checkpoint-only > $2 2>&1 || { tail $2; exit 1; }
}

# lab_checkpoint_start MODEL LOG / lab_checkpoint_wait LOG: lab_checkpoint in the background (while the
# build runs: ~3 minutes of Python, GPU and disk), then waiting for it; a failure prints LOG and exits.
lab_checkpoint_start() {
    (lab_checkpoint $1 $2) > /dev/null 2>&1 &
    LAB_CKPT=$!
}
lab_checkpoint_wait() {
    wait $LAB_CKPT || { echo "making the checkpoint failed:"; tail $1; exit 1; }
}

# lab_plan G4 MODEL KV PLAN [EXTRA_FLAGS]: the decode labs' plan (NF4, cache dtype KV, chunk 1024, 32K
# context); the compiler's log goes to PLAN.log.
lab_plan() {
    $1 compile --model $WORK/$2 --device cuda --weights nf4 --kv-dtype $3 --chunk 1024 --max-context 32768 --no-fidelity \
        ${5:-} -o $4 2> $4.log || { tail $4.log; exit 1; }
}

# lab_sides PREFIX [PATCH...]: the sides of an A/B. A is this tree; B, C, ... are copies of it in
# $WORK/PREFIX_<side> (build folders left out) with each PATCH (a diff, e.g. `git diff` output) applied.
# Sets SIDES; lab_dir SIDE prints a side's folder.
lab_sides() {
    local i=0 s d p
    LAB_PREFIX=$1 LAB_ROOT=$PWD SIDES="A"
    shift
    for p in "$@"; do
        p=$(realpath "$p")
        s=$(printf "\\x$(printf %x $((66 + i)))")
        SIDES="$SIDES $s"
        d=$WORK/${LAB_PREFIX}_$s
        rm -rf $d && mkdir -p $d
        tar --exclude='./build*' -cf - . | tar -xf - -C $d
        (cd $d && patch -p1 -s < "$p") || { echo "patch $p does not apply"; exit 1; }
        i=$((i + 1))
    done
}
lab_dir() { if [ $1 = A ]; then echo $LAB_ROOT; else echo $WORK/${LAB_PREFIX}_$1; fi; }

# lab_build_sides TESTS TARGETS...: every side's $BUILD (G4_BUILD_TESTS=TESTS), built side by side.
lab_build_sides() {
    local tests=$1 s d pids=()
    shift
    for s in $SIDES; do
        d=$(lab_dir $s)
        (cmake -S $d -B $d/$BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DG4_BUILD_TESTS=$tests ${CMAKE_ARGS:-} > $d/cmake.log 2>&1 &&
            cmake --build $d/$BUILD -j$JOBS --target "$@" > $d/build.log 2>&1) &
        pids+=($!)
    done
    for s in $SIDES; do
        wait ${pids[0]} || { tail -30 $(lab_dir $s)/build.log; exit 1; }
        pids=("${pids[@]:1}")
    done
}

# lab_rounds RESULT FN ARG...: ROUNDS rounds of `g4 bench` (-p 512 -n 128 -d $DEPTHS) on each side in turn;
# side s (A, B, ...) is ARG s, and FN S_INDEX ARG prints the command prefix that runs g4 bench for it (its
# plan last). Appends '## round N S [ARG]' and the JSON to RESULT, then prints the medians.
lab_rounds() {
    local R=$1 fn=$2 r s side a
    shift 2
    : > $R
    for r in $(seq $ROUNDS); do
        s=0
        for a in "$@"; do
            side=$(printf "\\x$(printf %x $((65 + s)))")
            echo "## round $r $side [$a]" >> $R
            $($fn $s "$a") -p 512 -n 128 -d $DEPTHS -r 3 --json >> $R 2>&1
            s=$((s + 1))
        done
    done
    python3 bench/scripts/ab_summary.py "$R"
}
