"""Do two processes on one machine form one PJRT topology through a CPU plugin?

Starts one client per process with `node_id`, `num_nodes` and key-value callbacks backed by a
directory both processes share (the multi-process options PJRT's CUDA plugin takes, see
docs/multi-host.md), and prints what the client reports: its process index, its devices and its
addressable devices, and which keys the plugin wrote to the store. A plugin that forms the
topology shows `devices` = the sum over processes, `addressable` = its own, and keys in the
store; one that ignores the options shows one process of its own.

    python3 scripts/multiprocess_probe.py PLUGIN.so NODE NUM_NODES STORE_DIR

Run NUM_NODES of them at once with the same STORE_DIR (empty at the start), e.g.
    mkdir -p /tmp/kv; for n in 0 1; do python3 scripts/multiprocess_probe.py P.so $n 2 /tmp/kv & done; wait
The structs are mirrored by hand from the PJRT C API (PJRT 0.81+ layout, as crates/tlaloc-pjrt
does); this script is a probe, not part of the runtime.
"""
import ctypes as C, os, sys, time
lib = C.CDLL(sys.argv[1]); lib.GetPjrtApi.restype = C.c_void_p
node, nodes, store = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
api = lib.GetPjrtApi()
fn = lambda i: C.cast(C.c_void_p.from_address(api + 16 + 24 + 8 * i).value, C.CFUNCTYPE(C.c_void_p, C.c_void_p))
libc = C.CDLL(None); libc.malloc.restype = C.c_void_p; libc.malloc.argtypes = [C.c_size_t]
FREE = C.cast(libc.free, C.c_void_p).value
class NV(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("name", C.c_char_p), ("name_size", C.c_size_t),
                ("type", C.c_int), ("value", C.c_int64), ("value_size", C.c_size_t)]
class GetA(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("key", C.c_void_p), ("key_size", C.c_size_t),
                ("timeout_ms", C.c_int), ("cb_error", C.c_void_p), ("user", C.c_void_p), ("value", C.c_void_p),
                ("value_size", C.c_size_t), ("deleter", C.c_void_p)]
class PutA(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("key", C.c_void_p), ("key_size", C.c_size_t),
                ("value", C.c_void_p), ("value_size", C.c_size_t), ("cb_error", C.c_void_p), ("user", C.c_void_p)]
CB = C.CFUNCTYPE(C.c_void_p, C.c_void_p)
path = lambda key: os.path.join(store, key.hex())
def get(p):
    a = GetA.from_address(p); key = C.string_at(a.key, a.key_size)
    deadline = time.time() + a.timeout_ms / 1000
    while not os.path.exists(path(key)) and time.time() < deadline:
        time.sleep(0.01)
    if not os.path.exists(path(key)):
        err = C.cast(a.cb_error, C.CFUNCTYPE(C.c_void_p, C.c_int, C.c_char_p, C.c_size_t))
        msg = b"timed out waiting for " + key
        return err(4, msg, len(msg))  # DEADLINE_EXCEEDED
    data = open(path(key), "rb").read()
    buf = libc.malloc(max(1, len(data))); C.memmove(buf, data, len(data))
    a.value, a.value_size, a.deleter = buf, len(data), FREE
    return None
def put(p):
    a = PutA.from_address(p); key = C.string_at(a.key, a.key_size)
    tmp = path(key) + f".tmp{node}"
    open(tmp, "wb").write(C.string_at(a.value, a.value_size)); os.replace(tmp, path(key))
    return None
get_cb, put_cb = CB(get), CB(put)
class CA(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("opts", C.c_void_p), ("n", C.c_size_t),
                ("g", C.c_void_p), ("gu", C.c_void_p), ("p", C.c_void_p), ("pu", C.c_void_p), ("client", C.c_void_p),
                ("tg", C.c_void_p), ("tgu", C.c_void_p)]
class EM(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("error", C.c_void_p), ("msg", C.c_void_p), ("size", C.c_size_t)]
class PI(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p)]
pi = PI(C.sizeof(PI), None); fn(3)(C.addressof(pi))
opts = [(b"cpu_device_count", 1), (b"node_id", node), (b"num_nodes", nodes)]
arr = (NV * len(opts))(*[NV(C.sizeof(NV), None, n, len(n), 1, v, 1) for n, v in opts])
ca = CA(C.sizeof(CA), None, C.cast(arr, C.c_void_p), len(opts), C.cast(get_cb, C.c_void_p), None, C.cast(put_cb, C.c_void_p), None)
err = fn(10)(C.addressof(ca))
if err:
    em = EM(C.sizeof(EM), None, err); fn(1)(C.addressof(em)); print(node, "refused:", C.string_at(em.msg, em.size).decode()); sys.exit(1)
class DA(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("client", C.c_void_p), ("devices", C.c_void_p), ("n", C.c_size_t)]
class PX(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("client", C.c_void_p), ("index", C.c_int)]
out = []
for name, i in (("devices", 15), ("addressable", 16)):
    da = DA(C.sizeof(DA), None, ca.client); fn(i)(C.addressof(da)); out.append(f"{name} {da.n}")
px = PX(C.sizeof(PX), None, ca.client); fn(13)(C.addressof(px))
print(f"node {node}: client created; process index {px.index}; " + ", ".join(out), "; keys in store:", sorted(os.listdir(store)), flush=True)
time.sleep(1)
