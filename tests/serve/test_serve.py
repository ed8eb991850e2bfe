"""`g4 serve` driven by real clients: the official `openai` package, curl, and raw HTTP for what clients
cannot send (malformed bodies, a client that disconnects). Greedy outputs are compared with `g4 run`'s."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import http.client
import json
import subprocess
import time
import urllib.request

import openai
import pytest

from conftest import FIX, Server, g4_run, post

PROMPTS = ["Hello there", "The capital of France is", "Write a haiku about the sea.", "1, 2, 3,",
           "Tell me a story", "What is 2+2?", "Translate to French: cat", "Name three colors"]


def client(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_models_health_metrics(server):
    ids = [m.id for m in client(server).models.list()]
    assert ids == ["tiny"]
    m = server.metrics()
    assert m["g4_slots"] == 4
    assert "g4_queue_depth" in m and "g4_time_to_first_token_seconds_count" in m


def test_chat_matches_g4_run(server, plan):
    r = client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}],
                                               temperature=0, max_tokens=24)
    want = g4_run(plan, PROMPTS[0], 24)
    assert r.choices[0].message.content == want
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == 24 else "stop")


def test_chat_streaming_equals_non_streaming(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[1]}]
    # 200 tokens: long enough for the stream to be read while they are generated (20 took a few ms, which a
    # loaded machine may not schedule the reader in, and the whole reply came as one piece).
    kw = dict(model="tiny", messages=msgs, temperature=0, max_tokens=200, extra_body={"ignore_eos": True})
    full = c.chat.completions.create(**kw)
    pieces, finish, usage = [], None, None
    for chunk in c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            pieces.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert len(pieces) > 2
    assert "".join(pieces) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_match_g4_run(server, plan):
    c = client(server)
    r = c.completions.create(model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=16)
    assert r.choices[0].text == g4_run(plan, PROMPTS[1], 16, chat=False)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=16, stream=True) if ch.choices)
    assert streamed == r.choices[0].text


def test_stop_strings(server, plan):
    want = g4_run(plan, PROMPTS[2], 40, extra=("--ignore-eos",))
    # An ASCII stretch of the greedy output, past its start, as the stop string.
    i = next(k for k in range(3, len(want) - 2) if want[k:k + 2].isascii() and want[k:k + 2].strip() == want[k:k + 2])
    stop = want[i:i + 2]
    r = client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}],
                                               temperature=0, max_tokens=40, stop=[stop],
                                               extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == want[:want.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_sampling_is_seeded(server):
    c = client(server)
    kw = dict(model="tiny", messages=[{"role": "user", "content": PROMPTS[4]}], max_tokens=16, temperature=1.0,
              top_p=0.9, seed=7, extra_body={"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1})
    a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_image_message(server):
    img = (FIX / "towers" / "image" / "rgb_37x53.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(img).decode()
    c = client(server)
    text_only = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is this?"}],
                                          temperature=0, max_tokens=4)
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], temperature=0,
                                  max_tokens=4)
    assert r.usage.prompt_tokens > text_only.usage.prompt_tokens + 2  # <boi>, the soft tokens, <eoi>
    # The same file through a file:// URL under --media-dir gives the same prompt and greedy reply.
    path = FIX / "towers" / "image" / "rgb_37x53.png"
    content[0]["image_url"]["url"] = "file://" + str(path)
    f = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], temperature=0,
                                  max_tokens=4)
    assert f.usage.prompt_tokens == r.usage.prompt_tokens
    assert f.choices[0].message.content == r.choices[0].message.content
    # Undecodable bytes, and a file outside --media-dir: 400s naming the problem; the server keeps serving.
    for bad, word in (("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "image"),
                      ("file:///etc/passwd", "outside")):
        content[0]["image_url"]["url"] = bad
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=4)
        assert word in e.value.message
    assert c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2).usage


def test_audio_message(server):
    wav = (FIX / "towers" / "audio_files" / "tones_44k1_stereo.wav").read_bytes()
    content = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
               {"type": "text", "text": "Transcribe"}]
    c = client(server)
    try:
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], temperature=0,
                                      max_tokens=4)
    except openai.BadRequestError as e:  # a build without FFmpeg reads 16 kHz WAV only: said so
        assert "FFmpeg" in e.message
        return
    assert r.usage.prompt_tokens > 10


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}


def test_tools_and_tool_results_are_rendered(server):
    c = client(server)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    plain = c.chat.completions.create(model="tiny", messages=ask, temperature=0, max_tokens=2)
    with_tools = c.chat.completions.create(model="tiny", messages=ask, tools=[WEATHER], temperature=0, max_tokens=2)
    # The declaration (name, description, schema) is in the prompt; tool_choice none leaves it out.
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10
    none = c.chat.completions.create(model="tiny", messages=ask, tools=[WEATHER], tool_choice="none",
                                     temperature=0, max_tokens=2)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    after = c.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], temperature=0, max_tokens=2)
    assert after.usage.prompt_tokens > with_tools.usage.prompt_tokens + 5
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=2)
    assert "tool_choice" in e.value.message
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny", messages=ask + [{"role": "tool", "tool_call_id": "x", "content": "1"}],
                                  max_tokens=2)


def test_eight_concurrent_clients_match_g4_run(server, plan):
    c = client(server)

    def ask(p):
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], temperature=0,
                                      max_tokens=24)
        return r.choices[0].message.content

    before = server.metrics()
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(ask, PROMPTS))
    assert got == [g4_run(plan, p, 24) for p in PROMPTS]
    # The decode steps ran batched: steps fed tokens of several sessions at once.
    after = server.metrics()
    steps = after["g4_batch_steps_total"] - before["g4_batch_steps_total"]
    fed = after["g4_batch_tokens_total"] - before["g4_batch_tokens_total"]
    assert steps > 0 and fed > steps


def test_no_batch_steps_each_session_alone(plan):
    s = Server(plan, "--max-sessions", "4", "--no-batch", "--model-name", "tiny")
    try:
        c = client(s)

        def ask(p):
            r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], temperature=0,
                                          max_tokens=12)
            return r.choices[0].message.content

        with cf.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(ask, PROMPTS[:4]))
        assert got == [g4_run(plan, p, 12) for p in PROMPTS[:4]]
        assert s.metrics()["g4_batch_steps_total"] == 0
    finally:
        assert s.stop() == 0, s.stderr


def test_client_disconnect_frees_the_slot(server):
    before = server.metrics().get("g4_requests_cancelled_total", 0)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 4000,
            "ignore_eos": True, "temperature": 0}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "  # the first event, then hang up mid-stream
    conn.sock.close()
    conn.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = server.metrics()
        if m["g4_requests_cancelled_total"] > before and m["g4_slots_busy"] == 0:
            break
        time.sleep(0.05)
    assert m["g4_requests_cancelled_total"] == before + 1
    assert m["g4_slots_busy"] == 0
    # 4000 tokens were not generated for nobody.
    assert m["g4_completion_tokens_total"] < 4000 + 2000


def test_curl_streaming_and_not(server):
    body = json.dumps({"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 8, "temperature": 0})
    r = subprocess.run(["curl", "-sS", "-f", server.url + "/v1/chat/completions", "-H",
                        "Content-Type: application/json", "-d", body], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    full = json.loads(r.stdout)
    assert full["object"] == "chat.completion" and full["usage"]["completion_tokens"] >= 1
    s = subprocess.run(["curl", "-sS", "-N", "-f", server.url + "/v1/chat/completions", "-H",
                        "Content-Type: application/json", "-d", body[:-1] + ', "stream": true}'],
                       capture_output=True, timeout=60)
    assert s.returncode == 0, s.stderr
    events = [ln[6:] for ln in s.stdout.decode().split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    # The same counts; the streamed request reuses the first one's prompt (cached_tokens).
    tokens = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [chunks[-1]["usage"][k] for k in tokens] == [full["usage"][k] for k in tokens]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


def test_malformed_requests_get_4xx(server):
    url = server.url + "/v1/chat/completions"
    ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        ({**ok, "temperature": "hot"}, 400, "temperature"),
        ({**ok, "frobnicate": 1}, 400, "frobnicate"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
        ({**ok, "max_tokens": -3}, 400, "max_tokens"),
        ({**ok, "n": 2}, 400, "n"),
        ({**ok, "top_p": 0}, 400, "top_p"),
        ({**ok, "stop": [1]}, 400, "stop"),
        ({**ok, "model": "gpt-17"}, 404, "model"),
    ]
    for body, status, param in cases:
        st, _, raw = post(url, body)
        assert st == status, (body, st, raw)
        err = json.loads(raw)["error"]
        assert err["message"] and err["type"]
        if param:
            assert err["param"] == param, err
    st, _, raw = post(server.url + "/v1/nothing", ok)
    assert st == 404 and "error" in json.loads(raw)
    assert post(url, ok)[0] == 200  # still serving


def test_context_limits_name_both_numbers(server):
    url = server.url + "/v1/chat/completions"
    st, _, raw = post(url, {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 2})
    assert st == 400
    msg = json.loads(raw)["error"]["message"]
    assert "4096" in msg and "tokens" in msg
    st, _, raw = post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096})
    assert st == 400
    msg = json.loads(raw)["error"]["message"]
    assert "4096" in msg and "max_tokens" in msg


def test_full_queue_gets_429_and_api_key(plan, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    s = Server(plan, "--max-sessions", "1", "--max-queue", "1", "--api-key-file", str(key), "--max-body", "65536")
    try:
        url = s.url + "/v1/chat/completions"
        auth = {"Authorization": "Bearer s3cret"}
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1500, "ignore_eos": True}
        assert post(url, body)[0] == 401
        assert post(url, body, {"Authorization": "Bearer s3creT"})[0] == 401
        with cf.ThreadPoolExecutor(12) as ex:
            res = list(ex.map(lambda _: post(url, body, auth), range(12)))
        codes = sorted(r[0] for r in res)
        assert codes.count(200) >= 2 and codes.count(429) >= 1 and set(codes) <= {200, 429}, codes
        busy = next(r for r in res if r[0] == 429)
        assert busy[1].get("Retry-After") == "1"
        assert json.loads(busy[2])["error"]["type"] == "rate_limit_error"
        big = {"messages": [{"role": "user", "content": "x" * 70000}]}
        st, _, raw = post(url, big, auth)
        assert st == 413 and "error" in json.loads(raw)
        with pytest.raises(openai.AuthenticationError):
            client(s, "wrong").models.list()
        r = client(s, "s3cret").chat.completions.create(model=plan.rsplit("/", 1)[1][:-7],
                                                        messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.usage.completion_tokens >= 1
    finally:
        assert s.stop() == 0


def test_timeout_ends_a_long_request_and_queue_zero_takes_idle_slots(plan):
    s = Server(plan, "--timeout", "0.2", "--max-queue", "0")
    try:
        # 4000 tokens take far longer than 0.2 s on any CPU (the tiny model decodes a few thousand a second).
        st, _, raw = post(s.url + "/v1/completions", {"prompt": "go", "max_tokens": 4000, "ignore_eos": True})
        assert st == 200, raw
        r = json.loads(raw)
        assert r["choices"][0]["finish_reason"] == "length"
        assert 0 < r["usage"]["completion_tokens"] < 4000
        assert s.metrics()["g4_requests_cancelled_total"] == 1
        assert post(s.url + "/v1/completions", {"prompt": "go", "max_tokens": 2})[0] == 200
    finally:
        assert s.stop() == 0


def test_sigterm_lets_running_requests_finish(plan):
    s = Server(plan)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 2000,
                "ignore_eos": True}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.read(6) == b"data: "
        s.proc.send_signal(15)
        rest = resp.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")
        last = json.loads([ln for ln in rest.split("\n") if ln.startswith("data: {")][-1][6:])
        assert last["usage"]["completion_tokens"] == 2000
        assert s.proc.wait(timeout=30) == 0  # exits by itself once the request is answered
    finally:
        assert s.stop() == 0
    assert "SIGTERM" in s.stderr


SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely. " * 3}


def test_prefix_reuse_gives_the_outputs_of_a_fresh_session(plan):
    """A shared system prompt, a repeated prompt, a conversation's next turn, completions and images: with prefix
    reuse (one slot, so every request meets the previous one's tokens) the greedy and seeded outputs are those
    of a server without it and of `g4 run`; usage and /metrics count the reused tokens."""
    reuse, fresh = Server(plan, "--max-sessions", "1"), Server(plan, "--max-sessions", "1", "--no-prefix-reuse")
    try:
        a, b = client(reuse), client(fresh)
        img = {n: "data:image/png;base64," + base64.b64encode((FIX / "towers" / "image" / n).read_bytes()).decode()
               for n in ("rgb_37x53.png", "grey_50x90.png")}

        def pic(name):
            return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img[name]}},
                                                 {"type": "text", "text": "What is in this picture? Name colors."}]}]

        seeded = dict(temperature=1.0, seed=7, extra_body={"top_k": 40})
        steps = [([SYSTEM, {"role": "user", "content": PROMPTS[0]}], {}),
                 ([SYSTEM, {"role": "user", "content": PROMPTS[1]}], {}),
                 ([SYSTEM, {"role": "user", "content": PROMPTS[1]}], seeded),
                 ([{"role": "user", "content": PROMPTS[0]}], {}),
                 ([{"role": "user", "content": PROMPTS[0] + ", friend"}], {}),
                 (pic("rgb_37x53.png"), {}), (pic("rgb_37x53.png"), {}), (pic("grey_50x90.png"), {})]
        got, cached = [], []
        for msgs, kw in steps:
            kw = {"temperature": 0, **kw}
            r = a.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, **kw)
            f = b.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, **kw)
            assert r.choices[0].message.content == f.choices[0].message.content, msgs
            assert r.usage.prompt_tokens == f.usage.prompt_tokens
            assert f.usage.prompt_tokens_details.cached_tokens == 0
            got.append(r.choices[0].message.content)
            cached.append((r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens))
        assert got[3] == g4_run(plan, PROMPTS[0], 12) and got[4] == g4_run(plan, PROMPTS[0] + ", friend", 12)
        assert cached[0][0] == 0
        assert cached[1][0] > 30                       # the system prompt
        assert cached[2][0] == cached[2][1] - 16       # the same prompt: all but its last 16 tokens
        assert 0 < cached[4][0] <= cached[4][1] - 16   # the user turn's shared start
        assert cached[6][0] == cached[6][1] - 16       # the same image: its soft tokens reused too
        assert cached[7][0] < 10                       # another image: nothing from its <boi> on
        # The next turn of a conversation reuses the previous prompt (and what of the reply tokenizes alike).
        conv = [SYSTEM, {"role": "user", "content": PROMPTS[2]}]
        first = a.chat.completions.create(model="tiny", messages=conv, temperature=0, max_tokens=12)
        conv += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": PROMPTS[3]}]
        r = a.chat.completions.create(model="tiny", messages=conv, temperature=0, max_tokens=12)
        f = b.chat.completions.create(model="tiny", messages=conv, temperature=0, max_tokens=12)
        assert r.choices[0].message.content == f.choices[0].message.content
        assert r.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
        total = (sum(c for c, _ in cached) + first.usage.prompt_tokens_details.cached_tokens +
                 r.usage.prompt_tokens_details.cached_tokens)
        # Completions, streamed: the usage chunk carries the count too.
        for p in (PROMPTS[1], PROMPTS[1] + " Paris"):
            chunks = list(a.completions.create(model="tiny", prompt=p, temperature=0, max_tokens=10, stream=True,
                                               stream_options={"include_usage": True}))
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == g4_run(plan, p, 10, chat=False)
            total += chunks[-1].usage.prompt_tokens_details.cached_tokens
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
        assert reuse.metrics()["g4_prompt_tokens_cached_total"] == total
        assert fresh.metrics()["g4_prompt_tokens_cached_total"] == 0
    finally:
        assert reuse.stop() == 0 and fresh.stop() == 0


def test_client_gone_while_queued_frees_its_place_at_once(plan):
    s = Server(plan, "--max-sessions", "1", "--max-queue", "1")
    try:
        long = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        long.request("POST", "/v1/completions", json.dumps({"prompt": "go", "max_tokens": 4000, "ignore_eos": True,
                                                              "stream": True}), {"Content-Type": "application/json"})
        resp = long.getresponse()
        assert resp.read(6) == b"data: "  # running: the one slot is busy
        queued = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        queued.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}),
                       {"Content-Type": "application/json"})

        def health():
            with urllib.request.urlopen(s.url + "/health", timeout=5) as r:
                return json.loads(r.read())

        def wait_for(cond):
            deadline = time.time() + 10
            while time.time() < deadline and not cond():
                time.sleep(0.02)
            return cond()

        assert wait_for(lambda: health()["queue"] == 1)
        queued.sock.close()  # the client gives up while its request waits
        queued.close()
        assert wait_for(lambda: health()["queue"] == 0)
        assert health()["slots_busy"] == 1  # the running request goes on
        # Its place is free: another request is queued, not refused with 429, and runs once the slot frees.
        with cf.ThreadPoolExecutor(1) as ex:
            later = ex.submit(post, s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            assert wait_for(lambda: health()["queue"] == 1)
            long.sock.close()
            long.close()
            assert later.result(timeout=30)[0] == 200
        assert s.metrics()["g4_requests_cancelled_total"] == 2
    finally:
        assert s.stop() == 0


def test_a_request_goes_to_the_slot_holding_its_prefix(plan):
    s = Server(plan, "--max-sessions", "2")
    try:
        c = client(s)
        sys_a = {"role": "system", "content": "You are a pirate. Speak like one in every answer. " * 2}
        sys_b = {"role": "system", "content": "You are a poet. Answer in verse, with rhymes. " * 2}

        def ask(system, q):
            r = c.chat.completions.create(model="tiny", messages=[system, {"role": "user", "content": q}],
                                          temperature=0, max_tokens=4)
            return r.usage.prompt_tokens_details.cached_tokens

        assert ask(sys_a, PROMPTS[0]) == 0 and ask(sys_b, PROMPTS[0]) == 0  # one slot each
        # B's conversation first: the least recently used slot holds A's, but B's goes to the one holding B's.
        assert ask(sys_b, PROMPTS[1]) > 30
        assert ask(sys_a, PROMPTS[1]) > 30
    finally:
        assert s.stop() == 0
