"""Probe: what one torch call costs on a thread while another thread runs pure Python (holds the GIL).

    python3 benchmarks/probe_gil.py

Every torch op lets go of the GIL around its kernel and must win it back; with a Python-bound thread beside it,
each win waits up to the interpreter's switch interval (5 ms). Attribute reads and memoryview slices do not
let go. Session 9 (RESULTS.md): why adapter reads made of ~2,700 small torch calls ran 8x slower inside a run.
"""

import threading, time, torch

stop = threading.Event()


def bg():
    while not stop.is_set():
        sum(i * i for i in range(2000))


t2 = torch.randn(16, 4096)
flat = torch.randn(16 * 4096)
mv = memoryview(bytearray(1 << 20))
ops = {
    "reshape": lambda: t2.reshape(-1),
    "view": lambda: t2.view(-1),
    "getitem_slice": lambda: flat[100:200],
    "narrow": lambda: flat.narrow(0, 100, 100),
    "to_noop": lambda: t2.to(torch.float32),
    "dtype_attr": lambda: t2.dtype,
    "shape_attr": lambda: t2.shape,
    "data_ptr": lambda: t2.data_ptr(),
    "numel": lambda: t2.numel(),
    "memoryview_slice": lambda: mv[100:200],
}
N = 300
for name, op in ops.items():
    t = time.perf_counter()
    for _ in range(N):
        op()
    alone = (time.perf_counter() - t) / N * 1e6
    th = threading.Thread(target=bg)
    stop.clear()
    th.start()
    time.sleep(0.02)
    t = time.perf_counter()
    for _ in range(N):
        op()
    cont = (time.perf_counter() - t) / N * 1e6
    stop.set()
    th.join()
    print(f"{name:18s} alone {alone:8.2f} us  with python bg {cont:10.2f} us")
