"""Measures device-to-device copy bandwidth (bytes read + bytes written per second) with torch."""
import json

import torch

n_bytes = 4 << 30
src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
torch.cuda.synchronize()
times = []
for _ in range(20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
times.sort()
median = times[len(times) // 2]
print(json.dumps({"copy_bytes": n_bytes, "median_s": median,
                  "bandwidth_bytes_per_s": 2 * n_bytes / median,
                  "device": torch.cuda.get_device_name()}))
