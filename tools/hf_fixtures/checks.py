"""Checks the generator makes on a fixture's reference model before keeping a
seed: the MoE routing is used and has margins a bf16 kernel cannot flip, and
llama3 rope scaling really changes frequencies."""

from __future__ import annotations

import math

import numpy as np
import torch

from .spec import MIN_ROUTER_GAP, MIN_SIGMOID_GAP


class RoutingTooFragile(Exception):
    pass


def check_llama3_scaling(model) -> str:
    """Compare the model's inv_freq against unscaled rope; fail if identical."""
    cfg = model.config
    rp = cfg.rope_parameters
    hd = cfg.head_dim
    base = rp["rope_theta"]
    plain = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    used = model.model.rotary_emb.inv_freq.detach().float().cpu()
    ratio = (plain / used).numpy()
    n_unchanged = int(np.sum(np.isclose(ratio, 1.0, rtol=1e-6)))
    n_full = int(np.sum(np.isclose(ratio, rp["factor"], rtol=1e-6)))
    n_smooth = len(ratio) - n_unchanged - n_full
    if n_unchanged == len(ratio):
        raise SystemExit(
            "llama3 rope scaling changes no frequency for this head_dim; lower "
            "original_max_position_embeddings"
        )
    wavelen = (2 * math.pi / plain).numpy()
    return (
        f"llama3 rope: wavelens={np.round(wavelen, 1).tolist()} "
        f"plain/scaled={np.round(ratio, 4).tolist()} "
        f"(unchanged={n_unchanged}, smoothed={n_smooth}, divided-by-factor={n_full})"
    )


class RoutingCounter:
    """Forward hooks counting how many tokens pick each expert, per layer."""

    def __init__(self, model, n_experts: int, attr: str = "gate"):
        self.counts = {}
        self.min_gap = {}
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, attr, None)
            if gate is None or not hasattr(gate, "top_k"):
                continue
            self.counts[li] = np.zeros(n_experts, dtype=np.int64)
            self.handles.append(gate.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(_mod, _inp, out):
            logits, idx = out[0], out[2]  # (tokens, E), (tokens, top_k)
            self.counts[li] += np.bincount(idx.reshape(-1).numpy(), minlength=len(self.counts[li]))
            # Gap between the k-th and (k+1)-th router logit: small gaps would make
            # expert selection fragile under bf16 compute in the kernel under test.
            srt = torch.sort(logits.float(), dim=-1, descending=True).values
            gap = float((srt[:, idx.shape[-1] - 1] - srt[:, idx.shape[-1]]).min())
            self.min_gap[li] = min(self.min_gap.get(li, math.inf), gap)

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()

    def report_and_check(self):
        for li, c in self.counts.items():
            print(
                f"   layer {li} expert routing counts (prefill+2 decodes, top-k slots): {c.tolist()}; "
                f"min top-k/next router-logit gap={self.min_gap[li]:.4f}"
            )
            if self.min_gap[li] < MIN_ROUTER_GAP:
                raise RoutingTooFragile(f"layer {li} router margin {self.min_gap[li]:.4f} < {MIN_ROUTER_GAP}")
            if (c == 0).any():
                raise RoutingTooFragile(f"layer {li} router never picks some expert: {c.tolist()}")


class DeepseekRoutingCheck:
    """Recomputes DeepSeek-V3's noaux_tc routing from the router's input and
    checks it is stable and that both the bias and the group limit change some
    token's choice (so a reference that skips either fails)."""

    def __init__(self, model):
        self.handles, self.stats = [], {}
        for li, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if type(gate).__name__ == "DeepseekV3TopkRouter":
                self.stats[li] = dict(
                    counts=np.zeros(gate.num_experts, dtype=np.int64),
                    expert_gap=math.inf,
                    group_gap=math.inf,
                    by_bias=0,
                    by_group=0,
                    tokens=0,
                )
                self.handles.append(gate.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(mod, inp, out):
            st = self.stats[li]
            idx = out[2]
            x = inp[0].reshape(-1, mod.hidden_dim).float()
            s = torch.sigmoid(x @ mod.weight.float().t())
            b = s + mod.e_score_correction_bias.float()
            E, G, K, KG = mod.num_experts, mod.num_group, mod.top_k, mod.topk_group

            def select(sc):
                gs = sc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
                keep = torch.zeros_like(gs).scatter_(1, gs.topk(KG, dim=-1)[1], 1.0)
                mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                masked = sc.masked_fill(~mask, float("-inf"))
                return gs, masked, masked.topk(K, dim=-1)[1]

            gs, masked, sel = select(b)
            assert all(set(a.tolist()) == set(c.tolist()) for a, c in zip(sel, idx)), "routing recompute differs"
            st["counts"] += np.bincount(idx.reshape(-1).numpy(), minlength=E)
            srt = masked.sort(dim=-1, descending=True).values
            st["expert_gap"] = min(st["expert_gap"], float((srt[:, K - 1] - srt[:, K]).min()))
            if KG < G:
                gsrt = gs.sort(dim=-1, descending=True).values
                st["group_gap"] = min(st["group_gap"], float((gsrt[:, KG - 1] - gsrt[:, KG]).min()))
            _, _, sel_nobias = select(s)
            sel_nogroup = b.topk(K, dim=-1)[1]
            for a, nb, ng in zip(idx, sel_nobias, sel_nogroup):
                st["by_bias"] += set(a.tolist()) != set(nb.tolist())
                st["by_group"] += set(a.tolist()) != set(ng.tolist())
            st["tokens"] += idx.shape[0]

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()

    def report_and_check(self, n_group: int, topk_group: int):
        for li, st in self.stats.items():
            print(
                f"   layer {li} deepseek routing: counts={st['counts'].tolist()} "
                f"min expert gap={st['expert_gap']:.4f} min group gap={st['group_gap']:.4f} "
                f"tokens whose choice the bias changes={st['by_bias']}/{st['tokens']}, "
                f"the group limit changes={st['by_group']}/{st['tokens']}"
            )
            if (st["counts"] == 0).any():
                raise RoutingTooFragile(f"layer {li} router never picks some expert: {st['counts'].tolist()}")
            if st["expert_gap"] < MIN_SIGMOID_GAP or st["group_gap"] < MIN_SIGMOID_GAP:
                raise RoutingTooFragile(f"layer {li} sigmoid routing margin below {MIN_SIGMOID_GAP}")
            if st["by_bias"] == 0:
                raise RoutingTooFragile(f"layer {li}: the correction bias changes no token's experts")
            if topk_group < n_group and st["by_group"] == 0:
                raise RoutingTooFragile(f"layer {li}: the group limit changes no token's experts")


class MuseSparkRoutingCheck:
    """Recomputes Muse Spark's routing (``MuseSparkTopkRouter``) from the router's
    input: s = sigmoid(output_multiplier * x W^T) in float32, top-k of s + bias.
    Checks it matches HF's choice, every expert is used, the biased scores have
    margins a bf16 kernel cannot flip, and the bias changes some token's choice."""

    def __init__(self, model):
        self.handles, self.stats = [], {}
        for name, mod in model.named_modules():
            if type(mod).__name__ == "MuseSparkTopkRouter":
                self.stats[name] = dict(counts=np.zeros(mod.num_experts, dtype=np.int64),
                                        gap=math.inf, by_bias=0, tokens=0)
                self.handles.append(mod.register_forward_hook(self._hook(name)))
        assert self.stats, "no MuseSparkTopkRouter"

    def _hook(self, name):
        def fn(mod, inp, out):
            st = self.stats[name]
            idx = out[2]
            x = inp[0].reshape(-1, mod.hidden_dim).float()
            s = torch.sigmoid((x @ mod.weight.float().t()) * mod.output_multiplier)
            b = s + mod.e_score_correction_bias.float()
            K = mod.top_k
            sel = b.topk(K, dim=-1)[1]
            assert all(set(a.tolist()) == set(c.tolist()) for a, c in zip(sel, idx)), \
                "routing recompute differs"
            st["counts"] += np.bincount(idx.reshape(-1).numpy(), minlength=mod.num_experts)
            srt = b.sort(dim=-1, descending=True).values
            st["gap"] = min(st["gap"], float((srt[:, K - 1] - srt[:, K]).min()))
            nb = s.topk(K, dim=-1)[1]
            st["by_bias"] += sum(set(a.tolist()) != set(c.tolist()) for a, c in zip(idx, nb))
            st["tokens"] += idx.shape[0]

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()

    def report_and_check(self):
        for name, st in self.stats.items():
            print(f"   {name.removeprefix('model.language_model.')} routing: "
                  f"counts={st['counts'].tolist()} min biased-score gap={st['gap']:.4f} "
                  f"tokens whose choice the bias changes={st['by_bias']}/{st['tokens']}")
            if (st["counts"] == 0).any():
                raise RoutingTooFragile(f"{name} never picks some expert: {st['counts'].tolist()}")
            if st["gap"] < MIN_SIGMOID_GAP:
                raise RoutingTooFragile(f"{name} sigmoid routing margin below {MIN_SIGMOID_GAP}")
            if st["by_bias"] == 0:
                raise RoutingTooFragile(f"{name}: the selection bias changes no token's experts")
