// g4 serve: HTTP endpoints over cpp-httplib (see server.h).
#include "tools/serve/server.h"

#include "tools/serve/metrics.h"
#include "tools/serve/request.h"
#include "tools/serve/response.h"
#include "tools/serve/scheduler.h"
#include "tools/serve/tool_calls.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <dirent.h>
#include <functional>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <random>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>

namespace g4::serve {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);

void send_error(httplib::Response& res, int status, const std::string& type, const std::string& param,
                const std::string& msg) {
    res.status = status;
    res.set_content(dump(error_body(type, param, msg, status)), "application/json");
}

std::string finish_of(const Job& j) {
    return j.finish_reason == "length" ? "length" : "stop";
}

// The connection of a request, found by its addresses among the process's descriptors (cpp-httplib 0.11
// does not hand the socket to handlers), so that a handler waiting for a slot notices that its client closed
// the connection. Where it cannot be found (no /proc) a closed client is noticed once the job runs.
class ClientSocket {
public:
    ClientSocket(const httplib::Request& req, int local_port) : req_(req), local_port_(local_port) {}

    bool closed() {
        if (fd_ == -2) fd_ = find();
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
        char c;
        return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0; // readable with nothing to read: EOF
    }

private:
    static int port_of(const sockaddr_storage& a) {
        if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
        if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
        return -1;
    }

    int find() const {
        DIR* d = ::opendir("/proc/self/fd");
        if (!d) return -1;
        int found = -1;
        while (const dirent* e = ::readdir(d)) {
            char* end     = nullptr;
            const long fd = std::strtol(e->d_name, &end, 10);
            if (end == e->d_name || *end) continue;
            sockaddr_storage mine{}, peer{};
            socklen_t lm = sizeof mine, lp = sizeof peer;
            if (::getsockname((int)fd, (sockaddr*)&mine, &lm) != 0 ||
                ::getpeername((int)fd, (sockaddr*)&peer, &lp) != 0)
                continue;
            if (port_of(peer) != req_.remote_port || (local_port_ > 0 && port_of(mine) != local_port_))
                continue;
            char host[NI_MAXHOST];
            if (::getnameinfo((sockaddr*)&peer, lp, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0 ||
                req_.remote_addr != host)
                continue;
            found = (int)fd;
            break;
        }
        ::closedir(d);
        return found;
    }

    const httplib::Request& req_;
    int local_port_;
    int fd_ = -2; // -2: not looked for yet; -1: not found
};

class Server {
public:
    Server(g4_engine* e, const ServeOptions& o, Scheduler* sched, Metrics* metrics)
        : engine_(e), opts_(o), sched_(sched), metrics_(metrics) {
        g4_sampling_params_from_plan(e, &defaults_);
        g4_engine_get_info(e, &info_);
        g4_engine_get_media_info(e, &limits_.media);
        limits_.media_dir  = o.media_dir;
        limits_.max_tokens = o.max_tokens;
        ChatTemplate tpl;
        std::string err;
        if (engine_chat_template(e, &tpl, &err)) limits_.tools = tpl.tools;
        created_ = (long)std::time(nullptr);
    }

    void install(httplib::Server& svr) {
        svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (opts_.api_key.empty() || req.path == "/health")
                return httplib::Server::HandlerResponse::Unhandled;
            const std::string auth = req.get_header_value("Authorization");
            const std::string want = "Bearer " + opts_.api_key;
            if (constant_time_equal(auth, want)) return httplib::Server::HandlerResponse::Unhandled;
            send_error(res, 401, "invalid_request_error", "",
                       "missing or wrong API key (send the header Authorization: Bearer KEY)");
            metrics_->request_done(req.path, 401);
            return httplib::Server::HandlerResponse::Handled;
        });
        svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            const char* what = res.status == 404   ? "no such endpoint"
                               : res.status == 413 ? "the request body is larger than --max-body"
                               : res.status == 405 ? "method not allowed"
                                                   : "bad request";
            send_error(res, res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", "",
                       std::string(what) + ": " + req.method + " " + req.path);
            metrics_->request_done("other", res.status);
        });
        svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string msg = "internal error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                msg = e.what();
            } catch (...) {
            }
            send_error(res, 500, "server_error", "", msg);
        });
        svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(json{{"status", "ok"},
                                 {"slots", sched_->sessions()},
                                 {"slots_busy", sched_->running()},
                                 {"queue", sched_->queued()}}
                                .dump(-1, ' ', false, json::error_handler_t::replace),
                            "application/json");
        });
        svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            const DecodeBatcher* b = sched_->batcher();
            res.set_content(metrics_->render(sched_->queued(), sched_->running(), sched_->sessions(),
                                             b ? (long)b->steps() : 0, b ? (long)b->stepped_tokens() : 0),
                            "text/plain; version=0.0.4");
        });
        svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            json m = {{"id", opts_.model},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "g4"},
                      {"max_context", info_.max_context}};
            res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(
                                -1, ' ', false, json::error_handler_t::replace),
                            "application/json");
            metrics_->request_done("/v1/models", 200);
        });
        svr.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
        svr.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    }

    // Shutdown: new generation requests get 503; active() counts those still being answered.
    void drain() { draining_ = true; }
    int active() const { return active_.load(); }

private:
    void generate(const httplib::Request& req, httplib::Response& res, bool chat);
    void respond_json(const std::shared_ptr<Job>& job, const Shape& shape, httplib::Response& res,
                      std::function<void(bool)> release);
    void respond_stream(const std::shared_ptr<Job>& job, const Shape& shape, httplib::Response& res,
                        std::function<void(bool)> release);

    g4_engine* engine_;
    ServeOptions opts_;
    Scheduler* sched_;
    Metrics* metrics_;
    g4_sampling_params defaults_{};
    g4_engine_info info_{};
    RequestLimits limits_;
    long created_ = 0;
    std::atomic<bool> draining_{false};
    std::atomic<int> active_{0};
};

// Counts a generation request as active until its response is written (handed to the content provider's
// releaser when there is one).
struct ActiveGuard {
    std::atomic<int>* n;
    explicit ActiveGuard(std::atomic<int>* c) : n(c) { ++*n; }
    ~ActiveGuard() {
        if (n) --*n;
    }
    std::function<void(bool)> release() {
        std::atomic<int>* c = n;
        n                   = nullptr;
        return [c](bool) { --*c; };
    }
};

void Server::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    const std::string ep = chat ? "/v1/chat/completions" : "/v1/completions";
    ActiveGuard active(&active_);
    if (draining_) {
        send_error(res, 503, "server_error", "", "the server is shutting down");
        metrics_->request_done(ep, 503);
        return;
    }
    auto job = std::make_shared<Job>();
    try {
        OJson body;
        try {
            body = OJson::parse(req.body);
        } catch (const OJson::parse_error& e) {
            throw bad_request("", std::string("the body is not valid JSON: ") + e.what());
        }
        job->req = chat ? parse_chat_request(body, defaults_, limits_)
                        : parse_completion_request(body, defaults_, limits_);
        if (!job->req.model.empty() && job->req.model != opts_.model)
            throw ApiError(404, "not_found_error", "model",
                           "model '" + job->req.model + "' is not served here (GET /v1/models lists '" +
                               opts_.model + "')");
        sched_->probe(*job);
    } catch (const ApiError& e) {
        send_error(res, e.status, e.type, e.param, e.what());
        metrics_->request_done(ep, e.status);
        return;
    }
    job->submitted = Clock::now();
    job->deadline  = job->submitted + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(opts_.timeout_s));
    if (!sched_->submit(job)) {
        res.set_header("Retry-After", "1");
        send_error(res, 429, "rate_limit_error", "",
                   "the server is busy: " + std::to_string(sched_->queued()) +
                       " requests are queued (--max-queue); retry later");
        metrics_->request_done(ep, 429);
        return;
    }
    {
        // Until the prompt is fed errors still get their own status. A job still queued when its deadline
        // passes or its client goes away leaves the queue at once; one already taken is cancelled.
        ClientSocket client(req, opts_.port);
        std::unique_lock<std::mutex> l(job->m);
        bool stopped = false;
        while (!job->started && !job->finished) {
            job->cv.wait_for(l, kPoll);
            if (job->started || job->finished || stopped) continue;
            l.unlock();
            const bool late = Clock::now() >= job->deadline;
            const bool gone = !late && client.closed();
            if (late || gone) {
                stopped = true;
                if (sched_->withdraw(job)) {
                    if (gone) metrics_->cancelled();
                    send_error(res, gone ? 499 : 504, gone ? "cancelled" : "timeout", "",
                               gone ? "the client went away" : "the request timed out in the queue");
                    metrics_->request_done(ep, gone ? 499 : 504);
                    return;
                }
                job->cancel(late ? "timeout" : "client gone");
            }
            l.lock();
        }
        if (job->err_status != 0) {
            const int st = job->err_status == 499 ? 504 : job->err_status;
            send_error(res, st, job->err_type, "", job->err_msg);
            metrics_->request_done(ep, st);
            return;
        }
    }
    const Shape shape{chat, response_id(chat ? "chatcmpl" : "cmpl"), opts_.model, (long)std::time(nullptr)};
    metrics_->request_done(ep, 200);
    if (job->req.stream)
        respond_stream(job, shape, res, active.release());
    else
        respond_json(job, shape, res, active.release());
}

// The whole answer once the job ends; written as one chunk, so that the server notices a client that went
// away while it waits (the job is then cancelled and its slot freed).
void Server::respond_json(const std::shared_ptr<Job>& job, const Shape& shape, httplib::Response& res,
                          std::function<void(bool)> release) {
    res.set_chunked_content_provider(
        "application/json",
        [job, shape, tools = limits_.tools](size_t, httplib::DataSink& sink) {
            std::unique_lock<std::mutex> l(job->m);
            while (!job->finished) {
                if (!sink.is_writable()) {
                    l.unlock();
                    job->cancel("client gone");
                    return false;
                }
                job->cv.wait_for(l, kPoll);
            }
            const std::string s = dump(
                shape.final_response(job->text, finish_of(*job), job->prompt_tokens, job->completion_tokens,
                                     job->req.tools ? &tools : nullptr, job->cached_tokens));
            l.unlock();
            sink.write(s.data(), s.size());
            sink.done();
            return true;
        },
        release);
}

// Server-sent events: a chunk per piece of text as it is generated, then the finish reason, the usage
// (always; OpenAI's stream_options.include_usage asks for it as its own chunk with no choices), and [DONE].
void Server::respond_stream(const std::shared_ptr<Job>& job, const Shape& shape, httplib::Response& res,
                            std::function<void(bool)> release) {
    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, shape, first, tools = limits_.tools](size_t, httplib::DataSink& sink) {
            auto send = [&](const json& j) {
                const std::string s = "data: " + dump(j) + "\n\n";
                return sink.write(s.data(), s.size());
            };
            // With tools, text that is or may become a call is held back until the reply is complete.
            auto ready = [&] {
                return job->req.tools ? streamable_prefix(job->text, tools) : job->text.size();
            };
            std::unique_lock<std::mutex> l(job->m);
            while (ready() <= job->text_sent && !job->finished) {
                if (!sink.is_writable()) break;
                job->cv.wait_for(l, kPoll);
            }
            const bool done = job->finished;
            std::string piece;
            std::vector<ToolCall> calls;
            if (done && job->req.tools) {
                Reply r        = parse_reply(job->text, tools);
                piece          = r.content.size() > job->text_sent ? r.content.substr(job->text_sent) : "";
                calls          = std::move(r.calls);
                job->text_sent = job->text.size();
            } else {
                const size_t end = std::max(ready(), job->text_sent);
                piece            = job->text.substr(job->text_sent, end - job->text_sent);
                job->text_sent   = end;
            }
            if (!piece.empty() || *first) {
                json c       = shape.base(true);
                c["choices"] = json::array({shape.choice(piece, nullptr, true, *first)});
                *first       = false;
                l.unlock();
                const bool ok = send(c);
                l.lock();
                if (!ok) {
                    l.unlock();
                    job->cancel("client gone");
                    return false;
                }
            }
            if (!done) {
                if (!sink.is_writable()) {
                    l.unlock();
                    job->cancel("client gone");
                    return false;
                }
                return true;
            }
            json tail;
            if (job->err_status != 0) tail = error_body(job->err_type, "", job->err_msg, job->err_status);
            const json fin       = shape.final_chunk(calls, finish_of(*job), job->prompt_tokens,
                                                     job->completion_tokens, job->cached_tokens);
            json usage           = shape.base(true);
            usage["choices"]     = json::array();
            usage["usage"]       = usage_json(job->prompt_tokens, job->completion_tokens, job->cached_tokens);
            const bool own_usage = job->req.include_usage;
            l.unlock();
            if (!tail.is_null()) send(tail);
            send(fin);
            if (own_usage) send(usage);
            static const char kDone[] = "data: [DONE]\n\n";
            sink.write(kDone, sizeof kDone - 1);
            sink.done();
            return true;
        },
        release);
}

} // namespace

int serve(g4_engine* engine, const ServeOptions& opts, const std::atomic<int>& stop) {
    Metrics metrics;
    SchedulerOptions so;
    so.sessions     = opts.sessions;
    so.threads      = opts.threads;
    so.max_queue    = opts.max_queue;
    so.prefix_reuse = opts.prefix_reuse;
    so.batch        = opts.batch;
    Scheduler sched(engine, so, &metrics);
    Server api(engine, opts, &sched, &metrics);

    httplib::Server svr;
    // Every waiting request holds an HTTP thread: the slots, the queue and a few for /health, /metrics and
    // the 429 answers.
    const size_t http_threads = (size_t)opts.sessions + (size_t)opts.max_queue + 8;
    svr.new_task_queue        = [http_threads] { return new httplib::ThreadPool(http_threads); };
    svr.set_payload_max_length(opts.max_body);
    svr.set_keep_alive_timeout(2);
    svr.set_read_timeout(30);
    svr.set_write_timeout(30);
    api.install(svr);
    if (!svr.bind_to_port(opts.host, opts.port))
        throw std::runtime_error("cannot listen on " + opts.host + ":" + std::to_string(opts.port) +
                                 " (in use, or not an address of this machine)");
    std::fprintf(
        stderr,
        "g4 serve: %s as model '%s': %d session(s) x %d thread(s), queue %d; listening on http://%s:%d\n",
        opts.plan.c_str(), opts.model.c_str(), sched.sessions(), sched.threads_per_session(), opts.max_queue,
        opts.host.c_str(), opts.port);
    // Graceful shutdown: new generation requests get 503 while the ones accepted run to their end (bounded by
    // the request timeout), then the listener closes.
    std::atomic<bool> listening_done{false};
    std::thread watcher([&] {
        while (!stop.load() && !listening_done.load())
            std::this_thread::sleep_for(kPoll);
        api.drain();
        const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double>(opts.timeout_s + 5));
        while (api.active() > 0 && !listening_done.load() && Clock::now() < until)
            std::this_thread::sleep_for(kPoll);
        svr.stop();
    });
    svr.listen_after_bind();
    listening_done = true;
    watcher.join();
    sched.stop();
    std::fprintf(stderr, "g4 serve: stopped\n");
    return 0;
}

} // namespace g4::serve
