"""The simulator's tightest numeric loops, one step each, as plain functions of floats and ints.

Why a module of their own: a macro-step prices and times every step of a run one by one (the
floats must be the stepping loop's, so the recurrences cannot be vectorised), ~0.23 us a step
each in CPython; on the 32-replica cluster benchmark they were a tenth of the run. Written with
nothing but typed locals so that mypyc compiles them to C doubles and ints (tools/build_native.py,
in the engine's library: compiled callers call them as C functions): the same IEEE operations in
the same order, so the compiled functions return the very floats these do (tests/test_kernels.py).
DenseRooflinePricer is the one class: the roofline's step price, its constants held as typed
attributes so that a stepped step's price is one call (~22 us interpreted, ~3 us compiled).

Stdlib only, no imports of ours: a pure function of numbers, whichever build runs it.
"""

from __future__ import annotations


def step_timeline(now: float, gpu_s: list[float], num_in_flight: int, cpu_s: float, later_s: float,
                  deadline_s: float, free_at: float) -> tuple[list[float], list[float], list[float]]:
    """(schedule times, GPU end times, update times) of the steps priced in gpu_s that fit before
    `later_s` (every update strictly before it) and `deadline_s` (every schedule strictly before
    it), with the stepping loop's arithmetic: start = max(t + cpu_s, GPU free), end = start + gpu,
    and the clock reaches a time as t + (due - t) (SimPy's timeout). The update after schedule j is
    step j's own (num_in_flight 0: sync) or the previous step's (async, whose end was free_at)."""
    pending = free_at  # async: end of the step the next update applies
    t = now
    sched_t: list[float] = []
    ends: list[float] = []
    upd_t: list[float] = []
    for g in gpu_s:
        if not t < deadline_s:
            break
        start = t + cpu_s
        if free_at > start:  # max(t + cpu_s, free_at), as Python's max picks
            start = free_at
        end = start + g
        due = pending if num_in_flight else end
        u = t + (due - t) if due > t else t
        if not u < later_s:
            break
        sched_t.append(t)
        ends.append(end)
        upd_t.append(u)
        free_at = end
        pending = end
        t = u
    return sched_t, ends, upd_t


def decode_step_prices(ctx_sum: int, n: int, num_steps: int, num_layers: int, gemm_s: float,
                       elementwise_s: float, comm_s: float, head_s: float, flops_per_pair: float,
                       attn_c: float, attn_m: float, attn_o: float, kv_bytes_per_tok: float,
                       q_bytes: float, skew_alpha: float, skew_kv: int) -> list[float]:
    """The roofline's GPU time of num_steps all-decode steps of n requests whose contexts sum to
    ctx_sum at the first and grow by n a step (RooflineCostModel.decode_step_times_s, which
    prices a batch's fixed parts once): per layer, attention is the larger of its compute and
    memory times plus its overhead, moved skew_alpha of the way to the attention with skew_kv more
    KV tokens (the decodes' imbalance term: skew_kv = n x the longest context - their sum, fixed
    along the run; 0 = no term); a step adds ((gemm + attention) + elementwise) + comm per
    layer, then the head, in the order step_time_s sums them."""
    out: list[float] = []
    for _step in range(num_steps):
        kv_tokens = ctx_sum + n
        compute = (kv_tokens + 0.0) * flops_per_pair * attn_c
        memory = (kv_tokens * kv_bytes_per_tok + q_bytes) * attn_m
        attn = (memory if memory > compute else compute) + attn_o
        if skew_kv:
            kv_max = kv_tokens + skew_kv
            compute = (kv_max + 0.0) * flops_per_pair * attn_c
            memory = (kv_max * kv_bytes_per_tok + q_bytes) * attn_m
            attn += skew_alpha * ((memory if memory > compute else compute) + attn_o - attn)
        out.append(num_layers * (gemm_s + attn + elementwise_s + comm_s) + head_s)
        ctx_sum += n
    return out


class DenseRooflinePricer:
    """RooflineCostModel.step_time_s of one step, for a model without sliding-window layers or an
    MLA decode table: the batch sums, one layer's (GEMMs, attention, elementwise, collectives)
    and the head, in the very order the model's reference path (roofline.py: _work,
    _layer_parts, _head_parts) computes them, so the same floats. What depends on a callable of
    the model's (the all-reduce and logits-gather curves, the MoE experts) is priced by the
    caller and passed in; everything else is a constant fixed at construction.

    Every constant is a float: where the reference multiplies two ints and then a float, this
    multiplies floats, which is exact as long as the int product is below 2**53 (byte counts of
    a step: ~1e12 at most for a million-token batch)."""

    def __init__(self, num_layers: int, gemms: list[tuple[float, float, float, float, float]],
                 s_per_byte: float, kernel_overhead_s: float, has_moe: bool,
                 attn: tuple[float, float, float, float, float, float, float], ew_bytes_per_tok: float,
                 ew_kernels: int, head: tuple[float, float, float, float, float], head_s_per_flop: float,
                 has_gather: bool) -> None:
        """gemms: (FLOPs per token, weight bytes, activation bytes per token, s/FLOP, fraction of
        layers) each; attn: (FLOPs per query-key pair, s/FLOP, s/byte, overhead s, KV bytes per
        token, Q+O bytes per token, the decodes' skew alpha (0: no imbalance term)); head: (lm_head FLOPs per row, lm_head weight bytes, its
        activation bytes per row, sampler bytes per row, embedding / norm bytes per token)."""
        self.num_layers = num_layers
        self.gemm_flops = [g[0] for g in gemms]
        self.gemm_weight_bytes = [g[1] for g in gemms]
        self.gemm_act_bytes = [g[2] for g in gemms]
        self.gemm_s_per_flop = [g[3] for g in gemms]
        self.gemm_frac = [g[4] for g in gemms]
        self.m = s_per_byte
        self.ko = kernel_overhead_s
        self.has_moe = has_moe
        self.flops_per_pair, self.attn_c, self.attn_m, self.attn_o, self.kv_bytes, self.q_bytes, \
            self.skew_alpha = attn
        self.ew_bytes = ew_bytes_per_tok
        self.ew_kernels = ew_kernels
        self.head_flops, self.head_wbytes, self.head_rbytes, self.sampler_bytes, self.tok_bytes = head
        self.head_c = head_s_per_flop
        self.has_gather = has_gather

    def step_s(self, new: tuple[int, ...], ctx: tuple[int, ...], num_sampled: int, experts_s: float,
               comm_s: float, gather_s: float) -> float:
        """Seconds of a step whose requests compute new[i] tokens on ctx[i] cached ones; experts_s:
        one layer's routed experts (has_moe), comm_s: one layer's collectives, gather_s: the
        logits gather (has_gather; read only when num_sampled)."""
        tokens = 0
        ctx_sum = 0
        n_decode = 0
        cp = 0
        cc = 0
        pctx = 0
        kmax = 0  # the longest decode's context (cost_model.decode_skew.max_decode_context)
        for i in range(len(new)):  # cost_model.base.batch_sums' integers
            n = new[i]
            c = ctx[i]
            tokens += n
            ctx_sum += c
            if n == 1:
                n_decode += 1
                if c > kmax:
                    kmax = c
            else:
                cp += n * c
                cc += n * n
                pctx += c
        if tokens == 0:
            return 0.0
        # causal query-key pairs (an int plus a float, as _work adds them) and KV tokens read
        pairs = float(ctx_sum - pctx + n_decode + cp) + 0.5 * float(cc + tokens - n_decode)
        kv_tokens = ctx_sum + tokens
        m = self.m
        ko = self.ko
        gemm = self._gemm_s(tokens, experts_s)
        compute = pairs * self.flops_per_pair * self.attn_c
        memory = (kv_tokens * self.kv_bytes + tokens * self.q_bytes) * self.attn_m
        attn = (memory if memory > compute else compute) + self.attn_o
        if n_decode > 1 and self.skew_alpha:  # the decodes' imbalance, as roofline._layer_parts
            skew_kv = n_decode * kmax - (ctx_sum - pctx)
            if skew_kv:
                compute = (pairs + skew_kv) * self.flops_per_pair * self.attn_c
                memory = ((kv_tokens + skew_kv) * self.kv_bytes + tokens * self.q_bytes) * self.attn_m
                attn += self.skew_alpha * ((memory if memory > compute else compute) + self.attn_o - attn)
        elementwise = tokens * self.ew_bytes * m + self.ew_kernels * ko
        layer = gemm + attn + elementwise + comm_s
        embed = tokens * self.tok_bytes * m + ko
        norm = tokens * self.tok_bytes * m + ko
        if num_sampled == 0:
            return self.num_layers * layer + (embed + norm)  # + 0.0 + 0.0: the same float
        lm_head = self._lm_head_s(num_sampled, gather_s)
        sampler = num_sampled * self.sampler_bytes * m + 2 * ko
        return self.num_layers * layer + (embed + norm + lm_head + sampler)

    def _gemm_s(self, tokens: int, experts_s: float) -> float:
        """One layer's GEMMs for `tokens` tokens, and its routed experts (has_moe): step_s's and
        verify_steps_s' one expression."""
        m = self.m
        ko = self.ko
        gemm = 0.0
        for g in range(len(self.gemm_flops)):
            compute = tokens * self.gemm_flops[g] * self.gemm_s_per_flop[g]
            memory = (self.gemm_weight_bytes[g] + tokens * self.gemm_act_bytes[g]) * m
            gemm += self.gemm_frac[g] * ((memory if memory > compute else compute) + ko)
        if self.has_moe:
            gemm += experts_s
        return gemm

    def _lm_head_s(self, num_sampled: int, gather_s: float) -> float:
        """The LM head over num_sampled rows, and the logits gather (has_gather): step_s's and
        verify_steps_s' one expression."""
        m = self.m
        compute = num_sampled * self.head_flops * self.head_c
        memory = (self.head_wbytes + num_sampled * self.head_rbytes) * m
        lm_head = (memory if memory > compute else compute) + self.ko
        if self.has_gather:
            lm_head += gather_s
        return lm_head

    def verify_steps_s(self, num_new: int, num_requests: int, ctx_sums: list[int], experts_s: float,
                       comm_s: float, gather_s: float) -> list[float]:
        """step_s of steps whose num_requests requests each compute num_new (> 1) tokens and sample,
        on contexts summing to ctx_sums[j] (speculative decoding's verify steps): no request is a
        decode (a single new token), so step_s's integers are functions of num_requests and the
        context sum alone (cp = num_new x the sum, cc = num_requests x num_new**2, no skew term),
        and everything but attention is fixed along the steps. The same operations in the same
        order as step_s, hence the same floats (tests/test_kernels.py); experts_s, comm_s and
        gather_s as step_s takes them for num_requests x num_new tokens."""
        tokens = num_requests * num_new
        if tokens == 0:
            return [0.0] * len(ctx_sums)
        m = self.m
        ko = self.ko
        gemm = self._gemm_s(tokens, experts_s)
        elementwise = tokens * self.ew_bytes * m + self.ew_kernels * ko
        embed = tokens * self.tok_bytes * m + ko
        norm = tokens * self.tok_bytes * m + ko
        lm_head = self._lm_head_s(num_requests, gather_s)
        sampler = num_requests * self.sampler_bytes * m + 2 * ko
        head = embed + norm + lm_head + sampler
        half_pairs = 0.5 * float(num_requests * num_new * num_new + tokens)  # step_s's 0.5 * float(cc + tokens)
        q_bytes = tokens * self.q_bytes
        out: list[float] = []
        for ctx_sum in ctx_sums:
            pairs = float(num_new * ctx_sum) + half_pairs
            kv_tokens = ctx_sum + tokens
            compute = pairs * self.flops_per_pair * self.attn_c
            memory = (kv_tokens * self.kv_bytes + q_bytes) * self.attn_m
            attn = (memory if memory > compute else compute) + self.attn_o
            layer = gemm + attn + elementwise + comm_s
            out.append(self.num_layers * layer + head)
        return out
