"""g4_measure.py - measuring helpers shared by e2e_bench.py and long_context_bench.py (NVIDIA GPUs only: nvidia-smi)."""
import re, subprocess, threading, time


class GpuPeak:
    """Highest GPU memory used by compute processes (nvidia-smi), sampled every 20 ms while in the block."""
    def __init__(self):
        self.peak, self.stop = 0, False
    def __enter__(self):
        def poll():
            while not self.stop:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True).stdout.split()
                self.peak = max([self.peak] + [int(x) for x in out if x.isdigit()])
                time.sleep(0.02)
        self.t = threading.Thread(target=poll, daemon=True)
        self.t.start()
        return self
    def __exit__(self, *a):
        self.stop = True
        self.t.join()


def gib(s):
    """'3.44 GiB' / '186 MiB' / '12 KiB' from g4 compile's memory table, in GiB."""
    v, unit = s.split()
    return float(v) * {"GiB": 1, "MiB": 1 / 1024, "KiB": 1 / 2**20}[unit]


def planned_gpu_mib(compile_report):
    """The plan's cuda:0 total from the compiler's memory table (CUDA context and allocator not included)."""
    m = re.search(r"^\s+cuda:0\s+([\d.]+ \w+)", compile_report, re.M)
    return round(gib(m.group(1)) * 1024) if m else None
