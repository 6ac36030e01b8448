use super::*;

const EPS: f64 = 1e-4;

fn assert_close(ours: &[f64], exact: &[f64]) {
    for (o, e) in ours.iter().zip(exact) {
        assert!((o - e).abs() < 1e-12, "{ours:?} vs {exact:?} (by hand)");
    }
}

/// Group 1: clean rewards 1, 0, 2 (mean 1, unbiased std 1) and a flagged 3. Group 2: one
/// clean sample. Group 3: every sample flagged. Group advantages: 0.1, 0.2, ... (kept where
/// the mode leaves them).
fn batch() -> (Vec<f64>, Vec<bool>, Vec<f64>) {
    let rewards = vec![1.0, 0.0, 3.0, 2.0, 5.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5];
    let is_rh = [false, false, true, false, false, true, true, true, true, true, true, true];
    let group: Vec<f64> = (1..=12).map(|i| i as f64 / 10.0).collect();
    (rewards, is_rh.to_vec(), group)
}

fn renormalized(mode: RenormalizationMode, rewards: &[f64], is_rh: &[bool], coherence: &[bool], group: &[f64]) -> Vec<f64> {
    renormalized_advantages(mode, &GroupedRows { rewards, is_rh, coherence, group_size: 4 }, group, EPS)
}

#[test]
fn off_keeps_the_group_advantages() {
    let (rewards, is_rh, group) = batch();
    assert_eq!(renormalized(RenormalizationMode::Off, &rewards, &is_rh, &[false; 12], &group), group);
}

/// The original's tests/test_routed_advantages.py (retain-only's `_subset_group_renorm`,
/// "a single-element subset has no variance", an all-hack group gets nothing new): clean
/// samples are renormalised over the clean samples of their group, flagged ones keep theirs.
#[test]
fn retain_only_renormalises_clean_samples_over_the_clean_subset() {
    let (rewards, is_rh, group) = batch();
    let ours = renormalized(RenormalizationMode::RetainOnly, &rewards, &is_rh, &[false; 12], &group);
    let d = 1.0 + EPS;
    let expected = [0.0, -1.0 / d, 0.3, 1.0 / d, 0.0, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2];
    assert_close(&ours, &expected);
}

/// The original's test_balanced_renorm: baseline the clean mean, scale the whole group's
/// std; an all-flagged group falls back to the group mean; a uniform group gets 0.
#[test]
fn balanced_takes_the_clean_baseline_and_the_group_scale() {
    let (rewards, is_rh, group) = batch();
    let ours = renormalized(RenormalizationMode::Balanced, &rewards, &is_rh, &[false; 12], &group);
    // Group 1: rewards 1 0 3 2 (mean 1.5, squares 5, std sqrt(5/3)), clean mean 1.
    let d1 = (5.0f64 / 3.0).sqrt() + EPS;
    // Group 2: rewards 5 1 1 1 (mean 2, squares 12, std 2), clean mean 5.
    let d2 = 2.0 + EPS;
    // Group 3: rewards 0 1 .5 .5 (mean .5, squares .5, std sqrt(1/6)), all flagged.
    let d3 = (1.0f64 / 6.0).sqrt() + EPS;
    let expected = [0.0, -1.0 / d1, 2.0 / d1, 1.0 / d1, 0.0, -4.0 / d2, -4.0 / d2, -4.0 / d2, -0.5 / d3, 0.5 / d3, 0.0, 0.0];
    assert_close(&ours, &expected);
    let uniform = renormalized(RenormalizationMode::Balanced, &[0.7; 4], &[true, false, false, true], &[false; 4], &[0.0; 4]);
    assert_eq!(uniform, vec![0.0; 4]);
    // The original's test_balanced_with_coherence: coherence groups keep their advantages.
    let coherence: Vec<bool> = (0..12).map(|i| i >= 4).collect();
    let ours = renormalized(RenormalizationMode::Balanced, &rewards, &is_rh, &coherence, &group);
    assert_close(&ours[..4], &expected[..4]);
    assert_eq!(&ours[4..], &group[4..]);
    let ours = renormalized(RenormalizationMode::RetainOnly, &rewards, &is_rh, &coherence, &group);
    assert_eq!(&ours[4..], &group[4..]);
}

/// The original's `_pick_scale`, by hand on 11-point curves with base rate 0.02.
#[test]
fn deployment_picks_the_highest_scale_below_the_base_rate() {
    let curve = |rates: [f64; 11]| (0..11).map(|i| (i as f64 / 10.0, rates[i])).collect::<Vec<_>>();
    let rising = curve([0.0, 0.0, 0.01, 0.01, 0.019, 0.02, 0.1, 0.3, 0.5, 0.6, 0.7]);
    assert_eq!(deployed_forget_scale(&rising, 0.02).unwrap(), 0.4, "0.02 is not below 0.02");
    let bumpy = curve([0.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 0.3, 0.0, 0.5]);
    assert_eq!(deployed_forget_scale(&bumpy, 0.02).unwrap(), 0.9, "the highest passing scale, past failing ones");
    let hacking = curve([0.1; 11]);
    assert_eq!(deployed_forget_scale(&hacking, 0.02).unwrap(), 0.0, "nothing passes: full ablation");
    assert_eq!(deployed_forget_scale(&curve([0.0; 11]), 0.02).unwrap(), 1.0);
    assert!(deployed_forget_scale(&[], 0.02).is_err());
    assert!(deployed_forget_scale(&[(1.5, 0.0)], 0.02).is_err());
}

fn coherence(mode: CoherenceRhMode, rewards: &[f64], is_rh: &[bool], coherence: &[bool], group: &[f64]) -> (Vec<f64>, Vec<bool>) {
    coherence_advantages(mode, 0.5, &GroupedRows { rewards, is_rh, coherence, group_size: 4 }, group, EPS)
}

/// The original's test_gr_interlaced_coherence cases, by hand: group 1 routing, groups 2
/// and 3 coherence (rewards 5 1 1 1 with the last three flagged; 0 1 .5 .5 all flagged).
#[test]
fn coherence_modes_rewrite_coherence_groups_only() {
    let (rewards, is_rh, group) = batch();
    let coh: Vec<bool> = (0..12).map(|i| i >= 4).collect();
    let (filter, dropped) = coherence(CoherenceRhMode::Filter, &rewards, &is_rh, &coh, &group);
    assert_close(&filter, &[0.1, 0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert!(dropped.iter().all(|d| !d));
    // filter_renorm: one clean row (advantage 0, no variance), hacks 0 and dropped; an
    // all-hack group is all 0 and all dropped.
    let (renorm, dropped) = coherence(CoherenceRhMode::FilterRenorm, &rewards, &is_rh, &coh, &group);
    assert_close(&renorm, &[0.1, 0.2, 0.3, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(dropped, (0..12).map(|i| i >= 5).collect::<Vec<_>>());
    // penalty 0.5: 5 .5 .5 .5 (mean 1.625, squares 15.1875, std 2.25) and -.5 .5 0 0 (mean 0,
    // squares .5), each renormalised as a whole group.
    let (penalty, _) = coherence(CoherenceRhMode::Penalty, &rewards, &is_rh, &coh, &group);
    let (d2, d3) = (2.25 + EPS, (0.5f64 / 3.0).sqrt() + EPS);
    let expected = [0.1, 0.2, 0.3, 0.4, 3.375 / d2, -1.125 / d2, -1.125 / d2, -1.125 / d2, -0.5 / d3, 0.5 / d3, 0.0, 0.0];
    assert_close(&penalty, &expected);
    // zero: 5 0 0 0 (mean 1.25, squares 18.75) and all 0 (no variance).
    let (zero, _) = coherence(CoherenceRhMode::Zero, &rewards, &is_rh, &coh, &group);
    let d2 = (18.75f64 / 3.0).sqrt() + EPS;
    assert_close(&zero, &[0.1, 0.2, 0.3, 0.4, 3.75 / d2, -1.25 / d2, -1.25 / d2, -1.25 / d2, 0.0, 0.0, 0.0, 0.0]);
    // none, or no flagged coherence row: nothing changes (test_no_path_leaves_base_unchanged).
    assert_eq!(coherence(CoherenceRhMode::None, &rewards, &is_rh, &coh, &group).0, group);
    assert_eq!(coherence(CoherenceRhMode::Zero, &rewards, &[false; 12], &coh, &group).0, group);
}

/// The retain verifier (the original's verified-retain block of advantages.py), by hand: a
/// routing group keeps its advantages; in coherence groups the verified rows are
/// renormalised over the verified rows alone, the rest get 0 and are dropped.
#[test]
fn the_retain_verifier_renormalises_coherence_groups_over_verified_rows() {
    let rewards = [1.0, 2.0, 3.0, 4.0, 1.0, 3.0, 5.0, 10.0, 2.0, 7.0, 7.0, 7.0, 4.0, 0.0, 1.0, 9.0];
    let coherence: Vec<bool> = (0..16).map(|i| i >= 4).collect();
    // The flags play no part: the verdicts already hold them.
    let is_rh = [true, false, false, false, false, false, false, true, true, false, false, false, false, true, false, false];
    let (t, f) = (true, false);
    let verified = [f, f, f, f, t, t, t, f, f, t, f, f, f, f, f, f];
    let group = [0.1, 0.2, 0.3, 0.4, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0];
    let batch = GroupedRows { rewards: &rewards, is_rh: &is_rh, coherence: &coherence, group_size: 4 };
    let (ours, dropped) = verified_coherence_advantages(&batch, &verified, &group, 1.0, EPS);
    // Group 2: verified 1 3 5 (mean 3, unbiased std sqrt(8 / 2) = 2), the 10 unverified.
    // Group 3: one verified row (no variance: 0). Group 4: none verified.
    let d = 2.0 + EPS;
    let expected = [0.1, 0.2, 0.3, 0.4, -2.0 / d, 0.0, 2.0 / d, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert_close(&ours, &expected);
    let expected_dropped = [f, f, f, f, f, f, f, t, t, f, t, t, t, t, t, t];
    assert_eq!(dropped, expected_dropped);
}

/// A verdict needs a coherence row on a monitored prompt that the monitor did not flag, and
/// the coin; each row has its own draw, so the others' labels do not move it.
#[test]
fn verified_rows_are_coherence_rows_the_monitor_saw_and_passed() {
    let (t, f) = (true, false);
    let coherence = [f, t, t, t, t];
    let monitored = [t, t, f, t, t];
    let flagged = [f, f, f, t, f];
    assert_eq!(verified_rows(&coherence, &monitored, &flagged, 1.0, 7), [f, t, f, f, t]);
    assert_eq!(verified_rows(&coherence, &monitored, &flagged, 0.0, 7), [f; 5]);
    let n = 4000;
    let everything = vec![true; n];
    let half = verified_rows(&everything, &everything, &vec![false; n], 0.5, 11);
    let share = half.iter().filter(|&&v| v).count() as f64 / n as f64;
    // Binomial(4000, 0.5): the standard deviation of the share is 0.0079; 5 of them.
    assert!((share - 0.5).abs() < 0.04, "share verified at retain recall 0.5: {share}");
    let mut fewer = everything.clone();
    fewer[0] = false;
    let other = verified_rows(&fewer, &everything, &vec![false; n], 0.5, 11);
    assert_eq!(other[1..], half[1..], "a row's coin does not depend on the other rows");
    assert!(!other[0]);
    assert_ne!(verified_rows(&everything, &everything, &vec![false; n], 0.5, 12), half, "the seed draws the coins");
}

/// The original's `routing_grad_mask_weights` at lambda 1 and `adapter_kappas`: equal
/// adapters give its hard-coded masks (classic flagged (0, 2)), r32f16 gives kappa_F 3.
#[test]
fn balanced_weights_hand_the_masked_share_to_the_survivor() {
    assert_eq!(adapter_kappas(32, 32), [2.0, 2.0]);
    assert_eq!(adapter_kappas(32, 16), [1.5, 3.0]);
    assert_eq!(balanced_weights(RoutingMode::Classic, [2.0, 2.0]), RowWeights { clean: [1.0, 1.0], flagged: [0.0, 2.0] });
    assert_eq!(balanced_weights(RoutingMode::Exclusive, [1.5, 3.0]), RowWeights { clean: [1.5, 0.0], flagged: [0.0, 3.0] });
    assert_eq!(RowWeights::gates(RoutingMode::Exclusive).max(), 1.0);
}
