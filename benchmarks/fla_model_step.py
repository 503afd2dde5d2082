"""One training step of a small fla ``KDAForCausalLM`` (random init): the user's script that
``kdadbg capture -- python benchmarks/fla_model_step.py`` runs unchanged (issue: capture from training).

Needs fla (``flash-linear-attention`` 0.6.0 and ``fla-core``), transformers and a GPU.
Example: kdadbg capture --out dumps -- python benchmarks/fla_model_step.py --T 4096 --gate softplus
"""

import argparse

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--v-heads", type=int, default=None, help="num_v_heads (GVA when > --heads)")
    p.add_argument("--gate", choices=("softplus", "lower_bound"), default="softplus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-config", action="store_true",
                   help="fla's kernels take their first autotune config (no minutes of autotuning per shape)")
    a = p.parse_args()
    from devices import use_device

    use_device("fla_model_step.py")
    if a.first_config:
        from triton.runtime.autotuner import Autotuner

        orig = Autotuner.prune_configs
        Autotuner.prune_configs = lambda self, *args, **kw: orig(self, *args, **kw)[:1]
    from fla.models import KDAConfig, KDAForCausalLM

    torch.manual_seed(a.seed)
    extra = {"safe_gate": True, "lower_bound": -5.0} if a.gate == "lower_bound" else {}
    cfg = KDAConfig(hidden_size=a.heads * 128, num_heads=a.heads, head_dim=128, num_v_heads=a.v_heads,
                    num_hidden_layers=a.layers, vocab_size=4096, fuse_cross_entropy=False, **extra)
    model = KDAForCausalLM(cfg).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (1, a.T), device="cuda")
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    print(f"step done: loss {out.loss.item():.4f}")


if __name__ == "__main__":
    main()
