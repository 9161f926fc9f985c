"""The named algorithms: each a :class:`~fedtune.algorithms.base.Preset`, a client method and a
server rule (declared in :mod:`fedtune.algorithms.declarations`) paired for the settings they are
meant for, with the defaults their authors' code uses where they differ from the components'.

Imports neither torch nor NumPy (the registries, the CLI and the config's checks read it).
"""

from __future__ import annotations

from fedtune.algorithms.base import Preset

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("fedavg", "sgd", "fedavg", ("fdg", "fl", "fda"), "FedAvg (McMahan et al.): local SGD, weighted mean of updates"),
    Preset("fedomg", "sgd", "fedomg", ("fdg", "fl"), "FedOMG (Nguyen et al.): local SGD, on-server matching gradient d = g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖ (omg_kappa, omg_solver, omg_rescale)",
           own_shared=("global_lr",)),
    Preset("fedda", "sgd", "fedda", ("fda",), "FedDA (Jiang et al.): Σ α_i[(1−β_i)Δ_T + β_i Δ_i] (gp_beta fixed or auto, gp_align)"),
    Preset("fedgp", "sgd", "fedgp", ("fda",), "FedGP (Jiang et al.): Σ α_i[(1−β_i)Δ_T + β_i Proj₊(Δ_T|Δ_i)] per tensor (gp_beta fixed or auto, gp_align)"),
    Preset("target-only", "sgd", "target_only", ("fda",), "target-only baseline: θ ← θ + Δ_T of the FDA target client, sources ignored"),
    Preset("fedprox", "prox", "fedavg", ("fdg", "fl", "fda"), "FedProx (Li et al.): local SGD + prox_mu/2 ||θ − θ_global||², FedAvg"),
    Preset("fedsam", "sam", "fedavg", ("fdg", "fl", "fda"), "FedSAM (Caldarola et al.): SAM local steps (sam_rho), FedAvg"),
    Preset("gfm", "gfm", "fedavg", ("fdg", "fl"), "GFM: SAM steps on global-model-constrained adversarial augmentations (sam_rho, gfm_*), FedAvg"),
    Preset("gca", "gca", "fedavg", ("fdg", "fl"), "GCA (GFM ablation): local SGD on the constrained adversarial augmentations (gfm_*), FedAvg"),
    Preset("simclr", "simclr", "fedavg", ("ufdg",), "FedAvg of SimCLR encoders (unsupervised), linear-probe evaluation"),
    Preset("fedgala", "gala", "gala", ("fdg", "fl"), "FedGaLA (Pourpanah et al.): locally gated SGD (gala_tau, gala_gate descent|literal) + global alignment at FedAvg scale (gala_iters, gala_mix, gala_weights per-tensor|whole)",
           unsupervised_client_method="gala-simclr"),
    Preset("fedsr", "fedsr", "fedavg", ("fdg", "fl"), "FedSR (Nguyen et al.): probabilistic representation z, CE + fedsr_l2r E‖z‖² + fedsr_cmi KL(p(z|x) ‖ r(z|y)) (fedsr_z_dim), FedAvg's uniform mean (the authors')",
           defaults=(("client_weighting", "uniform"),)),
    Preset("fedsam-omg", "sam", "fedomg", ("fdg", "fl"), "FedSAM+OMG (FedOMG paper's combination): SAM local steps (sam_rho) under FedOMG's matching gradient",
           own_shared=("global_lr",)),
    Preset("fedsr-omg", "fedsr", "fedomg", ("fdg", "fl"), "FedSR+OMG (FedOMG paper's combination)",
           own_shared=("global_lr",)),
    Preset("fedga", "sgd", "fedga", ("fdg", "fl"), "FedGA (Zhang et al.): local SGD, aggregation weights moved each round towards the clients with larger validation generalization gaps (fedga_step, fedga_decay, fedga_center, fedga_metric, fedga_init)"),
    Preset("scaffold", "scaffold", "fedavg", ("fdg", "fl"), "SCAFFOLD (Karimireddy et al.): local steps on g − c_i + c (control variates, option II), server c += |S|/N mean Δc_i, FedAvg (global_lr = η_g)"),
    Preset("feddyn", "feddyn", "fedavg", ("fdg", "fl"), "FedDyn (Acar et al.): local loss − ⟨∇L_k(θ_k^(t−1)), θ⟩ + feddyn_alpha/2 ‖θ − θ_global‖², server θ = mean − h/α (feddyn_mean rule|uniform)"),
    Preset("moon", "moon", "fedavg", ("fdg", "fl"), "MOON (Li et al.): CE + moon_mu · model-contrastive loss on the encoder features (z towards the global model's, away from the client's previous model's; moon_temperature), FedAvg"),
    Preset("fediir", "fediir", "fedavg", ("fdg", "fl"), "FedIIR (Guo et al.): CE + fediir_penalty ‖∇_classifier CE − ḡ‖², ḡ the server's EMA (fediir_ema) of the clients' mean classifier gradient, FedAvg's uniform mean (the authors')",
           defaults=(("client_weighting", "uniform"),)),
    Preset("fediir-omg", "fediir", "fedomg", ("fdg", "fl"), "FedIIR+OMG (FedOMG paper's combination)",
           own_shared=("global_lr",)),
    Preset("fishr", "fishr", "fedavg", ("fdg", "fl"), "Fishr (Ramé et al.; federated as FedOMG Eq. 4): CE + fishr_penalty ‖Var[per-example classifier gradients] − clients' mean‖² (fishr_ema, fishr_anneal_iters, fishr_distance), FedAvg"),
    # Bai et al.'s FedDG benchmark (ICLR 2024): DomainBed's penalties across the domains a client holds
    Preset("coral", "coral", "fedavg", ("fdg", "fl"), "DeepCORAL (Sun & Saenko; DomainBed, FedDG benchmark): CE + coral_weight · CORAL distance of the features across the batch's domains, FedAvg"),
    Preset("mmd", "mmd", "fedavg", ("fdg", "fl"), "MMD (Li et al.; DomainBed, FedDG benchmark): CE + mmd_weight · Gaussian-kernel MMD of the features across the batch's domains, FedAvg"),
    Preset("vrex", "vrex", "fedavg", ("fdg", "fl"), "V-REx (Krueger et al.; DomainBed, FedDG benchmark): mean per-domain risk + vrex_lambda · their variance (warm-up vrex_anneal_iters), FedAvg"),
    Preset("irm", "irm", "fedavg", ("fdg", "fl"), "IRM (Arjovsky et al., IRMv1; DomainBed, FedDG benchmark): mean per-domain risk + irm_lambda · IRMv1 penalty (warm-up irm_anneal_iters), FedAvg"),
    Preset("fish", "fish", "fedavg", ("fdg", "fl"), "Fish (Shi et al.; DomainBed, FedDG benchmark): each local step an inner step per domain of the batch, then θ moves fish_meta_lr of the way (fish_inner_optimizer), FedAvg"),
    Preset("groupdro", "groupdro", "fedavg", ("fdg", "fl"), "GroupDRO (Sagawa et al.; DomainBed, FedDG benchmark): Σ_d q_d R_d, the client's domain weights q ← q·exp(groupdro_eta R_d) kept across rounds, FedAvg"),
    Preset("fedgma", "sgd", "fedgma", ("fdg", "fl"), "FedGMA (Tenison et al.; FedDG benchmark): local SGD, FedAvg's step masked per coordinate by the clients' sign agreement (gma_tau, gma_mask soft|bai)"),
    Preset("afl", "afl", "fedavg", ("fdg", "fl"), "AFL (Mohri et al., agnostic FL; FedDG benchmark): local SGD on the λ-weighted domain risks, the server's domain weights λ ← Proj_simplex(λ + afl_lambda_lr · domain losses), FedAvg"),
    Preset("feddg", "feddg", "fedavg", ("fdg", "fl"), "FedDG (Liu et al., ELCFS's continuous frequency-space interpolation; FedDG benchmark): local SGD on images whose low-frequency amplitudes are interpolated towards other clients' (feddg_ratio_low, feddg_ratio_high), FedAvg"),
    Preset("fedadg", "fedadg", "fedavg", ("fdg", "fl"), "FedADG (Zhang et al.; FedDG benchmark): label-smoothed local steps, then the encoder features aligned adversarially to a federated generator's class-conditional distribution through each client's discriminator (fedadg_alpha, fedadg_epochs, fedadg_variant authors|authors_vlcs|bai), FedAvg's uniform mean (the authors')",
           defaults=(("client_weighting", "uniform"),)),
)}

__all__ = ["PRESETS"]
