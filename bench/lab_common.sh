# Shared steps of the decode labs on the GPU machine (bench/ab_env.sh, ab_patch.sh, skip_lab.sh,
# trace_lab.sh): source it from the repo root. Each function exits the calling script on failure, after
# printing the tail of its log.

# lab_build LOGTAG [TARGETS...]: configure and build build-dev here (header-only deps carried in .deps/usr).
lab_build() {
    local tag=$1
    shift
    cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=OFF > /tmp/${tag}_cmake.log 2>&1 &&
        cmake --build build-dev -j16 --target "${@:-g4}" > /tmp/${tag}_build.log 2>&1 || { tail -30 /tmp/${tag}_build.log; exit 1; }
}

# lab_checkpoint MODEL LOG: the random-weight real-shape checkpoint /tmp/g4bench/MODEL, made once per machine.
lab_checkpoint() {
    [ -f /tmp/g4bench/$1/config.json ] && return
    PYTHONPATH=$PWD/.bnb python3 bench/e2e_bench.py build-dev/tools/g4 --model $1 --checkpoint-only > $2 2>&1 || { tail $2; exit 1; }
}

# lab_checkpoint_start MODEL LOG / lab_checkpoint_wait LOG: lab_checkpoint in the background (while the
# build runs: ~3 min of Python, GPU and disk on a fresh machine), then waiting for it; a failure prints LOG
# and exits. An exit in between (a failed build) stops it.
lab_checkpoint_start() {
    (lab_checkpoint $1 $2) > /dev/null 2>&1 &
    LAB_CKPT=$!
    trap 'pkill -P $LAB_CKPT 2> /dev/null' EXIT
}
lab_checkpoint_wait() {
    wait $LAB_CKPT || { echo "making the checkpoint failed:"; tail $1; exit 1; }
}

# lab_plan G4 MODEL KV PLAN: the decode labs' plan (NF4, cache dtype KV, chunk 1024, 32K context); the
# compiler's log goes to PLAN.log.
lab_plan() {   # G4 MODEL KV PLAN [EXTRA_FLAGS]
    $1 compile --model /tmp/g4bench/$2 --device cuda --weights nf4 --kv-dtype $3 --chunk 1024 --max-context 32768 --no-fidelity \
        ${5:-} -o $4 2> $4.log || { tail $4.log; exit 1; }
}

# lab_sides PREFIX PATCH...: the sides of an A/B lab. A is this tree; B, C, ... are copies of it in
# /tmp/PREFIX_<side> (build folders and carried dependencies left out, .deps linked) with each PATCH
# applied. Sets SIDES; lab_dir SIDE prints a side's folder.
lab_sides() {
    local i=0 s d p
    LAB_PREFIX=$1 LAB_ROOT=$PWD SIDES="A"
    shift
    for p in "$@"; do
        p=$(realpath "$p")
        s=$(printf "\\x$(printf %x $((66 + i)))")
        SIDES="$SIDES $s"
        d=/tmp/${LAB_PREFIX}_$s
        rm -rf $d && mkdir -p $d
        tar --exclude='./build*' --exclude=./.deps --exclude=./.bnb -cf - . | tar -xf - -C $d
        ln -s $LAB_ROOT/.deps $d/.deps
        (cd $d && patch -p1 -s < "$p") || { echo "patch $p does not apply"; exit 1; }
        i=$((i + 1))
    done
}
lab_dir() { if [ $1 = A ]; then echo $LAB_ROOT; else echo /tmp/${LAB_PREFIX}_$1; fi; }

# lab_build_sides TESTS TARGETS...: every side's build-dev (G4_BUILD_TESTS=TESTS), built side by side.
lab_build_sides() {
    local tests=$1 s d pids=()
    shift
    for s in $SIDES; do
        d=$(lab_dir $s)
        (cmake -S $d -B $d/build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$LAB_ROOT/.deps/usr" -DG4_BUILD_TESTS=$tests > $d/cmake.log 2>&1 &&
            cmake --build $d/build-dev -j8 --target "$@" > $d/build.log 2>&1) &
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
    python3 bench/ab_summary.py "$R"
}
