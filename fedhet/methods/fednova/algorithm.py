"""FedNova (Wang et al.): average the clients' normalized updates, then rescale by tau_eff.

Client i's update d_i = (x - y_i) / a_i with a_i = sum_{k<tau_i} (1 - rho^(k+1)) / (1 - rho)
for SGD with momentum rho (a_i = tau_i without momentum); x <- x - tau_eff sum_i p_i d_i with
tau_eff = sum_i p_i a_i. With equal local steps this is exactly FedAvg.

A client that keeps its momentum buffer across rounds (`federation.momentum_buffers: client`)
moves further than a_i: its buffer's past gradients keep acting. a_i then counts them too
(`effective_steps` with the buffer's carried weight), so d_i stays the round's weighted mean
gradient; with equal carried weights and steps this is again exactly FedAvg.
"""

from fedhet.plugin import Trainer, effective_steps, tensors


class FedNova(Trainer):
    def aggregate(self, round, global_state, server_state, results, weights):
        a = [effective_steps(r.stats.steps, self.momentum, r.stats.carried) for r in results]
        tau_eff = sum(w * ai for w, ai in zip(weights, a, strict=True))
        coeffs = [w * tau_eff / ai for w, ai in zip(weights, a, strict=True)]
        averaged = tensors.weighted_average([r.state for r in results], weights)
        out = {}
        for name, x in global_state.items():
            if name not in self.param_names:
                out[name] = averaged[name]  # buffers (BN statistics) are plainly averaged
                continue
            step = sum(c * (x - r.state[name]) for c, r in zip(coeffs, results, strict=True))
            out[name] = x - step
        return out
