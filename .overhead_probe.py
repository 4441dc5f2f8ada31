import torch, time, normkit, torch.nn.functional as F
from normkit import aten
def t(fn, n=200):
    for _ in range(10): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - s) / n * 1e6
for shape, dt in [((32, 64, 56, 56), torch.bfloat16), ((2, 8, 4, 4), torch.float32), ((256, 64, 56, 56), torch.bfloat16)]:
    x = torch.randn(shape, device="cuda", dtype=dt).contiguous(memory_format=torch.channels_last)
    C = shape[1]; w = torch.ones(C, device="cuda"); b = torch.zeros(C, device="cuda"); rm = torch.zeros(C, device="cuda"); rv = torch.ones(C, device="cuda")
    e = t(lambda: F.batch_norm(x, rm, rv, w, b, training=True))
    nk = t(lambda: normkit.batch_norm(x, rm, rv, w, b, training=True))
    with normkit.enabled():
        en = t(lambda: F.batch_norm(x, rm, rv, w, b, training=True))
    from normkit.kernels import batch_norm as K
    kk = t(lambda: K.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5))
    print(f"bn fwd {shape} {dt}: eager {e:.1f}us  normkit.batch_norm {nk:.1f}us  enable() {en:.1f}us  raw kernel {kk:.1f}us")
x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16); w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
print(f"ln fwd: eager {t(lambda: F.layer_norm(x, (1024,), w)):.1f}us normkit {t(lambda: normkit.layer_norm(x, (1024,), w)):.1f}us")
with normkit.enabled():
    print(f"ln fwd enable {t(lambda: F.layer_norm(x, (1024,), w)):.1f}us rms enable {t(lambda: F.rms_norm(x, (1024,), w)):.1f}us")
print(f"rms fwd: eager {t(lambda: F.rms_norm(x, (1024,), w)):.1f}us normkit {t(lambda: normkit.rms_norm(x, (1024,), w)):.1f}us")
