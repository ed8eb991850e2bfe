#!/usr/bin/env bash
# Drives `g4 chat` on a terminal through tmux: line editing and history (GNU readline), /help, an unknown
# /command (reported, not sent), Ctrl-C during a reply (the reply stops, the conversation goes on), /save and
# /load, and Ctrl-C twice at an empty prompt (quits). The tiny fixture with --ignore-eos and a huge -n gives
# replies that run until stopped. Exit 77 (skipped) only when tmux is missing.
# Usage: chat_tmux_test.sh G4 FIXTURES_DIR
set -euo pipefail
g4=$1
fx=$2
export TERM=${TERM:-xterm}
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed (bash tools/setup.sh installs it)"; exit 77; }
work=$(mktemp -d)
sock=g4-chat-test-$$
T() { tmux -L "$sock" "$@"; }
trap 'T kill-server 2>/dev/null || true; rm -rf "$work"' EXIT

"$g4" compile --model "$fx/e2b_tiny" --weights f32 --max-context 4096 -o "$work/tiny.g4plan" 2>/dev/null
pane() { T capture-pane -p -S -2000 -t chat; }
fail() {
    echo "FAIL: $1"
    echo "---- pane ----"
    pane || true
    exit 1
}
# Waits (up to 60 s) until the pane shows the fixed string $1.
wait_for() {
    for _ in $(seq 600); do
        pane | grep -qF -- "$1" && return 0
        sleep 0.1
    done
    fail "the pane never showed '$1'"
}
# Waits until the reply to the last "> $1" line has started streaming, then presses Ctrl-C and waits for the
# note that the reply stopped.
stop_reply() {
    local before
    before=$(pane | grep -c "reply stopped" || true)
    for _ in $(seq 600); do
        [ "$(pane | tac | sed "/^> $1\$/q" | tac | tail -n +2 | tr -d ' \n' | wc -c)" -gt 8 ] && break
        sleep 0.1
    done
    T send-keys -t chat C-c
    for _ in $(seq 600); do
        [ "$(pane | grep -c "reply stopped" || true)" -gt "$before" ] && return 0
        sleep 0.1
    done
    fail "Ctrl-C did not stop the reply"
}

T new-session -d -s chat -x 160 -y 50 \
    "'$g4' chat '$work/tiny.g4plan' --temp 0 --ignore-eos -n 1000000; echo \"EXIT=\$?\"; sleep 600"
T set-option -t chat remain-on-exit on >/dev/null
wait_for "/help lists the commands"

# Line editing: "helo", two steps left, insert "l" -> "hello".
T send-keys -t chat "helo" Left Left "l" Enter
stop_reply hello

# History: up arrow recalls "hello".
T send-keys -t chat Up Enter
stop_reply hello

T send-keys -t chat "/help" Enter
wait_for "/save FILE"
T send-keys -t chat "/bogus stuff" Enter
wait_for "unknown command /bogus"

T send-keys -t chat "/save $work/a.json" Enter
wait_for "saved to $work/a.json: 4 messages"
T send-keys -t chat "/reset" Enter
wait_for "[conversation reset]"
T send-keys -t chat "/load $work/a.json" Enter
wait_for "loaded from $work/a.json: 4 messages"
T send-keys -t chat "/save $work/b.json" Enter
wait_for "saved to $work/b.json: 4 messages"

# Ctrl-C twice at an empty prompt quits, with status 0.
T send-keys -t chat C-c
wait_for "Ctrl-C again or Ctrl-D quits"
T send-keys -t chat C-c
wait_for "EXIT=0"

python3 - "$work/a.json" "$work/b.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["messages"]
b = json.load(open(sys.argv[2]))["messages"]
roles = [m["role"] for m in a]
assert roles == ["user", "model", "user", "model"], roles
assert a[0]["content"] == "hello" and a[2]["content"] == "hello", (a[0]["content"], a[2]["content"])
assert a[1]["content"] and a[3]["content"], "a stopped reply keeps the text it had"
assert all("/bogus" not in m["content"] for m in a), "an unknown command reached the model"
assert a == b, "/load then /save changed the conversation"
PY
echo "chat tmux test ok"
