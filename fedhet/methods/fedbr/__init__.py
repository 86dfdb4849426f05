"""FedBR (Guo et al., ICML 2023): local learning bias reduction with shared pseudo-data.

- `fedhet.methods.fedbr.pseudo`: RSM and Mixture pseudo-data generation (the `pseudo` stage is in
  `fedhet.methods.fedbr.pseudo_stage`).
- `fedhet.methods.fedbr.algorithm`: the `fedbr` algorithm: classifier debiasing (component 1)
  and the adversarial projection head (component 2), with the paper's ablation switches.

Nothing is imported here, so the stage and the algorithm modules can import each other's
building blocks without cycles.
"""
