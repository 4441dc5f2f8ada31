import torch, time, cProfile, pstats, normkit, torch.nn.functional as F
from normkit.kernels import batch_norm as K
x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
C = 64; w = torch.ones(C, device="cuda"); b = torch.zeros(C, device="cuda"); rm = torch.zeros(C, device="cuda"); rv = torch.ones(C, device="cuda")
def t(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - s) / n * 1e6
for _ in range(2):
    print("raw", t(lambda: K.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)), "ops", t(lambda: normkit.ops.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)),
          "functional", t(lambda: normkit.batch_norm(x, rm, rv, w, b, training=True)), "eager", t(lambda: F.batch_norm(x, rm, rv, w, b, training=True)))
    with normkit.enabled():
        print("enable", t(lambda: F.batch_norm(x, rm, rv, w, b, training=True)))
with normkit.enabled():
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): F.batch_norm(x, rm, rv, w, b, training=True)
    torch.cuda.synchronize()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
