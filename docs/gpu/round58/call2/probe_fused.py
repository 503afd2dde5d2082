import sys, traceback, torch
from kdadbg_kernels import chunk_kda
from kdadbg_kernels.chunk import kda_forward
H, T, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
dev = "cuda"
q, k, g, v = (torch.randn(1, T, H, 128, device=dev, dtype=torch.bfloat16) for _ in range(4))
beta = torch.randn(1, T, H, device=dev, dtype=torch.bfloat16)
A_log = torch.zeros(H, device=dev); dt = torch.zeros(H, 128, device=dev)
try:
    if mode == "infer":
        o, ht, s, _ = kda_forward(q, k, v, g, beta, scale=128 ** -0.5, chunk_size=64, gate="lower_bound", A_log=A_log,
                                  dt_bias=dt, precision="bf16", out_dtype=torch.bfloat16, keep_state=False)
    else:
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        o, ht = chunk_kda(*leaves, scale=128 ** -0.5, output_final_state=True, chunk_size=64,
                          use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                          A_log=A_log, dt_bias=dt, lower_bound=-5.0, precision="bf16")
        o.float().sum().backward()
    torch.cuda.synchronize()
    print(f"{mode} H{H} T{T} ok", flush=True)
except Exception as e:
    print(f"{mode} H{H} T{T} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
