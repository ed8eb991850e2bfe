// Atomic replacement of output files (see output_file.h).
#include "compiler/output_file.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace g4 {

namespace {

const char* file_type(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

std::string dir_of(const std::string& p) {
    const size_t s = p.rfind('/');
    return s == std::string::npos ? "." : s == 0 ? "/" : p.substr(0, s);
}

std::string base_of(const std::string& p) {
    const size_t s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

} // namespace

std::string output_target(const std::string& path, std::string* err) {
    if (path.empty() || path.back() == '/') {
        *err = "output path '" + path + "' names no file";
        return "";
    }
    std::string p = path;
    for (int hops = 0; hops < 40; ++hops) {
        struct stat st {};
        if (::lstat(p.c_str(), &st) != 0) {
            if (errno == ENOENT) return p; // a new file (its folder is checked when the temporary is created)
            *err = "cannot check output path " + p + " (" + std::strerror(errno) + ")";
            return "";
        }
        if (S_ISREG(st.st_mode)) return p;
        if (!S_ISLNK(st.st_mode)) {
            *err = path + (p == path ? "" : " (through a symbolic link, " + p + ")") + " exists and is " +
                   file_type(st.st_mode) + "; g4 writes only regular files (give a file path)";
            return "";
        }
        char buf[PATH_MAX];
        const ssize_t n = ::readlink(p.c_str(), buf, sizeof buf - 1);
        if (n < 0) {
            *err = "cannot read the symbolic link " + p + " (" + std::strerror(errno) + ")";
            return "";
        }
        std::string link(buf, (size_t)n);
        p = !link.empty() && link[0] == '/' ? link : dir_of(p) + "/" + link;
    }
    *err = path + ": too many levels of symbolic links";
    return "";
}

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

bool OutputFile::open(const std::string& path, std::string* err) {
    path_   = path;
    target_ = output_target(path, err);
    if (target_.empty()) return false;
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
        tmp_ = dir_of(target_) + "/." + base_of(target_) + ".tmp." + std::to_string(::getpid()) + "." +
               std::to_string(counter++);
        fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd_ >= 0) return true;
        if (errno != EEXIST) break;
    }
    *err = "cannot create a temporary file beside " + path + " (" + std::strerror(errno) +
           "): check the directory exists and is writable";
    tmp_.clear();
    return false;
}

bool OutputFile::write_at(uint64_t offset, const void* data, size_t n, std::string* err) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd_, p, n, (off_t)offset);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            *err = "write failed on " + tmp_ + " (" + (w < 0 ? std::strerror(errno) : "no progress") +
                   "; disk full?)";
            return false;
        }
        p += w, n -= (size_t)w, offset += (uint64_t)w;
    }
    return true;
}

bool OutputFile::commit(std::string* err) {
    if (::fsync(fd_) != 0) {
        *err = "flush failed on " + tmp_ + " (" + std::strerror(errno) + ")";
        return false;
    }
    const int fd = fd_;
    fd_          = -1;
    if (::close(fd) != 0) {
        *err = "close failed on " + tmp_ + " (" + std::strerror(errno) + ")";
        return false;
    }
    // The target may have been replaced by something else meanwhile: check again right before the rename.
    std::string again = output_target(path_, err);
    if (again.empty()) return false;
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
        *err = "cannot rename " + tmp_ + " to " + target_ + " (" + std::strerror(errno) + ")";
        return false;
    }
    committed_    = true;
    const int dfd = ::open(dir_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { // the rename itself on disk; best effort (some file systems refuse fsync on folders)
        ::fsync(dfd);
        ::close(dfd);
    }
    return true;
}

bool write_output_file(const std::string& path, const void* data, size_t n, std::string* err) {
    OutputFile f;
    return f.open(path, err) && f.write_at(0, data, n, err) && f.commit(err);
}

} // namespace g4
