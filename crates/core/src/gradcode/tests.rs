//! Tests of [`super`] (`gradcode.rs`).
use super::*;
use proptest::prelude::*;

/// Seeded part gradients of mixed magnitude: `n` parts of `len` values.
fn parts(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = SplitMix64(seed);
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    let mantissa = 2.0 * rng.unit() - 1.0;
                    let exp = (rng.next() % 7) as i32 - 3;
                    (mantissa * 10f64.powi(exp)) as f32
                })
                .collect()
        })
        .collect()
}

/// Every worker's vector for the given part gradients.
fn encode_all(code: &GradientCode, parts: &[Vec<f32>]) -> Vec<Vec<f32>> {
    (0..code.n())
        .map(|w| {
            let grads: Vec<&[f32]> = code.assignment(w).iter().map(|&(p, _)| parts[p].as_slice()).collect();
            code.encode(w, &grads)
        })
        .collect()
}

/// Decodes from `received` and checks the result against the plain sum of all parts:
/// ‖decoded − full‖∞ ≤ 1e-5 · max(1, ‖full‖∞). Returns the relative error.
fn check_decodes(code: &GradientCode, parts: &[Vec<f32>], vectors: &[Vec<f32>], received: &[usize]) -> f64 {
    let len = parts[0].len();
    let full: Vec<f64> = (0..len).map(|k| parts.iter().map(|p| f64::from(p[k])).sum()).collect();
    let given: Vec<(usize, &[f32])> = received.iter().map(|&w| (w, vectors[w].as_slice())).collect();
    let mut out = vec![f32::NAN; len];
    code.combine(&given, &mut out).unwrap_or_else(|e| panic!("{:?} n={} received {received:?}: {e}", code.spec(), code.n()));
    let scale = full.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let err = out.iter().zip(&full).map(|(&o, &f)| (f64::from(o) - f).abs()).fold(0.0, f64::max) / scale;
    assert!(
        err <= 1e-5,
        "{} n={} received {received:?}: relative error {err:e} (amplification {})",
        code.spec(),
        code.n(),
        code.amplification()
    );
    err
}

/// All `k`-subsets of `0..n`, in lexicographic order.
fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn go(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            go(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    go(0, n, k, &mut Vec::new(), &mut out);
    out
}

/// Checks every pattern of exactly `s` stragglers, and none; returns the worst error.
fn check_every_pattern(code: &GradientCode, seed: u64) -> f64 {
    let (n, s) = (code.n(), code.s());
    let parts = parts(n, 50, seed);
    let vectors = encode_all(code, &parts);
    let mut worst = check_decodes(code, &parts, &vectors, &(0..n).collect::<Vec<_>>());
    for stragglers in subsets(n, s) {
        let received: Vec<usize> = (0..n).filter(|w| !stragglers.contains(w)).collect();
        worst = worst.max(check_decodes(code, &parts, &vectors, &received));
    }
    worst
}

fn valid(scheme: Scheme, n: usize, s: usize) -> bool {
    s < n && (scheme == Scheme::Cyclic || n.is_multiple_of(s + 1))
}

#[test]
fn every_straggler_pattern_decodes_to_the_full_sum() {
    for scheme in [Scheme::FractionalRepetition, Scheme::Cyclic] {
        for n in 1..=6 {
            for s in (0..n).filter(|&s| valid(scheme, n, s)) {
                let code = GradientCode::new(scheme, n, s, 7).unwrap();
                assert_eq!((code.n(), code.s(), code.scheme()), (n, s, scheme));
                check_every_pattern(&code, (n * 10 + s) as u64);
            }
        }
    }
}

#[test]
fn cyclic_8_3_decodes_every_pattern() {
    for seed in [0, 1, 42] {
        let code = GradientCode::new(Scheme::Cyclic, 8, 3, seed).unwrap();
        assert!(code.amplification() < 50.0, "amplification {}", code.amplification());
        let worst = check_every_pattern(&code, seed + 100);
        eprintln!("cyclic:3, 8 workers, seed {seed}: amplification {:.2}, worst relative error {worst:.2e}", code.amplification());
    }
}

#[test]
fn larger_codes_decode_their_worst_patterns() {
    // every pattern for codes of up to 10 workers; both parities of n - s
    for (n, s) in [(7, 2), (7, 3), (9, 4), (10, 2), (10, 3), (10, 4)] {
        let code = GradientCode::new(Scheme::Cyclic, n, s, 3).unwrap();
        let worst = check_every_pattern(&code, 5);
        eprintln!("cyclic:{s}, {n} workers: amplification {:.2}, worst relative error {worst:.2e}", code.amplification());
    }
}

#[test]
fn fractional_repetition_is_exact() {
    let code = GradientCode::new(Scheme::FractionalRepetition, 6, 2, 0).unwrap();
    assert_eq!(code.amplification(), 1.0);
    let parts = parts(6, 50, 9);
    let vectors = encode_all(&code, &parts);
    // the decoder adds one plain sum per group: exactly the parts summed group by group
    let group = |k: usize, g: usize| (3 * g..3 * g + 3).map(|p| f64::from(parts[p][k])).sum::<f64>() as f32;
    let expect: Vec<f32> = (0..50).map(|k| (f64::from(group(k, 0)) + f64::from(group(k, 1))) as f32).collect();
    let mut out = vec![0.0; 50];
    code.combine(&[(5, &vectors[5][..]), (1, &vectors[1][..]), (4, &vectors[4][..]), (2, &vectors[2][..])], &mut out).unwrap();
    assert_eq!(out, expect);
    assert_eq!(code.decode(&[5, 1, 4, 2]).unwrap(), vec![(1, 1.0), (4, 1.0)], "the lowest-numbered worker of each group");
}

#[test]
fn assignment_support_is_exactly_the_documented_parts() {
    for n in 1usize..=9 {
        for s in 0..n {
            if n.is_multiple_of(s + 1) {
                let code = GradientCode::new(Scheme::FractionalRepetition, n, s, 0).unwrap();
                for w in 0..n {
                    let g = w / (s + 1);
                    let expect: Vec<(usize, f64)> = ((s + 1) * g..=(s + 1) * g + s).map(|p| (p, 1.0)).collect();
                    assert_eq!(code.assignment(w), expect, "frac:{s} n={n} worker {w}");
                }
            }
            let code = GradientCode::new(Scheme::Cyclic, n, s, 0).unwrap();
            for w in 0..n {
                let a = code.assignment(w);
                let support: Vec<usize> = a.iter().map(|&(p, _)| p).collect();
                assert_eq!(support, (0..=s).map(|t| (w + t) % n).collect::<Vec<_>>(), "cyclic:{s} n={n} worker {w}");
                assert_eq!(a[0].1, 1.0);
                assert!(a.iter().all(|&(_, c)| c.is_finite() && c != 0.0), "cyclic:{s} n={n} worker {w}: {a:?}");
            }
        }
    }
    // s = 0: each worker holds its own part, coefficient 1, in both schemes
    for scheme in [Scheme::FractionalRepetition, Scheme::Cyclic] {
        let code = GradientCode::new(scheme, 4, 0, 0).unwrap();
        assert_eq!((0..4).map(|w| code.assignment(w)).collect::<Vec<_>>(), (0..4).map(|w| vec![(w, 1.0)]).collect::<Vec<_>>());
        assert_eq!(code.decode(&[3, 0, 2, 1]).unwrap(), (0..4).map(|w| (w, 1.0)).collect::<Vec<_>>());
    }
    // s = n - 1: every worker holds everything, any one decodes
    let code = GradientCode::new(Scheme::Cyclic, 5, 4, 0).unwrap();
    let d = code.decode(&[3]).unwrap();
    assert_eq!(d.len(), 1);
    assert!((d[0].1 * code.assignment(3)[1].1 - 1.0).abs() < 1e-12);
}

#[test]
fn construction_errors() {
    for scheme in [Scheme::FractionalRepetition, Scheme::Cyclic] {
        assert!(matches!(GradientCode::new(scheme, 0, 0, 0), Err(CoreError::Consistency(_))));
        assert!(matches!(GradientCode::new(scheme, 3, 3, 0), Err(CoreError::Consistency(_))));
        assert!(matches!(GradientCode::new(scheme, 3, 7, 0), Err(CoreError::Consistency(_))));
    }
    let e = GradientCode::new(Scheme::FractionalRepetition, 5, 1, 0).unwrap_err();
    assert!(e.to_string().contains("multiple of 2"), "{e}");
    assert!(GradientCode::new(Scheme::FractionalRepetition, 6, 1, 0).is_ok());
    assert!(GradientCode::new(Scheme::Cyclic, 5, 1, 0).is_ok());
    assert!(GradientCode::new(Scheme::Cyclic, MAX_CYCLIC_WORKERS + 1, 1, 0).is_err());
    assert!(GradientCode::new(Scheme::FractionalRepetition, MAX_CYCLIC_WORKERS * 4, 1, 0).is_ok(), "no limit on frac");
}

#[test]
fn decode_refuses_too_few_duplicate_and_unknown_workers() {
    for scheme in [Scheme::FractionalRepetition, Scheme::Cyclic] {
        let code = GradientCode::new(scheme, 6, 2, 0).unwrap();
        assert!(code.decode(&[0, 1, 2, 3]).is_ok());
        let e = code.decode(&[0, 1, 2]).unwrap_err();
        assert!(matches!(e, CoreError::Codec(_)) && e.to_string().contains("4 needed"), "{e}");
        assert!(code.decode(&[]).is_err());
        let e = code.decode(&[0, 1, 2, 2]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        assert!(code.decode(&[0, 1, 2, 3, 3]).is_err(), "duplicates refused even with enough others");
        let e = code.decode(&[0, 1, 2, 6]).unwrap_err();
        assert!(e.to_string().contains("worker 6"), "{e}");
        assert!(code.decode(&[0, 1, 2, 3, usize::MAX]).is_err());
    }
}

#[test]
fn decode_ignores_order_and_uses_only_what_it_needs() {
    let code = GradientCode::new(Scheme::Cyclic, 7, 2, 11).unwrap();
    let a = code.decode(&[6, 0, 3, 2, 5, 1]).unwrap();
    assert_eq!(a, code.decode(&[0, 1, 2, 3, 5, 6]).unwrap());
    assert!(a.windows(2).all(|p| p[0].0 < p[1].0), "sorted by worker");
    assert!(a.len() <= 5, "at most n - s workers used: {a:?}");
    // the coefficients reproduce 1ᵀ
    let mut sum = [0.0f64; 7];
    for &(w, c) in &a {
        for (p, b) in code.assignment(w) {
            sum[p] += c * b;
        }
    }
    assert!(sum.iter().all(|x| (x - 1.0).abs() < 1e-9), "{sum:?}");
}

#[test]
fn encode_accumulates_in_f64() {
    let code = GradientCode::new(Scheme::FractionalRepetition, 3, 2, 0).unwrap();
    let (a, b, c) = ([1e8f32, 3.0], [1.0f32, -1.0], [-1e8f32, 0.5]);
    assert_eq!(code.encode(1, &[&a, &b, &c]), vec![1.0, 2.5]);
}

#[test]
fn combine_refuses_wrong_lengths_and_leaves_out_untouched() {
    let code = GradientCode::new(Scheme::Cyclic, 4, 1, 0).unwrap();
    let v = [1.0f32; 3];
    let short = [1.0f32; 2];
    let mut out = [9.0f32; 3];
    assert!(code.combine(&[(0, &v), (1, &short), (2, &v)], &mut out).is_err());
    assert!(code.combine(&[(0, &v), (1, &v)], &mut out).is_err(), "too few");
    assert_eq!(out, [9.0; 3]);
    assert!(code.combine(&[(0, &v), (1, &v), (2, &v)], &mut out).is_ok());
}

#[test]
fn the_same_seed_gives_the_same_code() {
    for (n, s) in [(6, 2), (7, 2), (5, 1)] {
        let a = GradientCode::new(Scheme::Cyclic, n, s, 5).unwrap();
        let b = GradientCode::new(Scheme::Cyclic, n, s, 5).unwrap();
        assert_eq!((0..n).map(|w| a.assignment(w)).collect::<Vec<_>>(), (0..n).map(|w| b.assignment(w)).collect::<Vec<_>>());
    }
}

#[test]
fn codespec_parses_and_displays() {
    for (text, scheme, s) in
        [("frac:1", Scheme::FractionalRepetition, 1), ("cyclic:0", Scheme::Cyclic, 0), ("cyclic:12", Scheme::Cyclic, 12)]
    {
        let spec: CodeSpec = text.parse().unwrap();
        assert_eq!(spec, CodeSpec { scheme, s });
        assert_eq!(spec.to_string(), text);
        assert_eq!(spec.to_string().parse::<CodeSpec>().unwrap(), spec);
    }
    assert_eq!(" frac:2 ".parse::<CodeSpec>().unwrap(), CodeSpec { scheme: Scheme::FractionalRepetition, s: 2 });
    for bad in
        ["", "none", "frac", "frac:", "cyclic:-1", "cyclic:+1", "cyclic:1.5", "frac:x", "mds:1", "Frac:1", "frac:1:2", "frac: 1", ":1"]
    {
        let e = bad.parse::<CodeSpec>().unwrap_err();
        assert!(matches!(e, CoreError::Consistency(_)) && e.to_string().contains("frac:S or cyclic:S"), "{bad:?}: {e}");
    }
    let code = "frac:1".parse::<CodeSpec>().unwrap().code(4, 0).unwrap();
    assert_eq!(code.spec().to_string(), "frac:1");
    assert!("frac:1".parse::<CodeSpec>().unwrap().code(5, 0).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    // Any valid code, any received set of at least n - s distinct workers: the decoding
    // coefficients reproduce 1ᵀ exactly enough, and the decoded gradients match the sum.
    #[test]
    fn any_received_set_of_enough_workers_decodes(
        cyclic in any::<bool>(),
        n in 1usize..=9,
        s_pick in 0usize..9,
        seed in any::<u64>(),
        order in any::<u64>(),
        extra in 0usize..9,
    ) {
        let scheme = if cyclic { Scheme::Cyclic } else { Scheme::FractionalRepetition };
        let choices: Vec<usize> = (0..n).filter(|&s| valid(scheme, n, s)).collect();
        let s = choices[s_pick % choices.len()];
        let code = GradientCode::new(scheme, n, s, seed).unwrap();
        // a random set of n - s + extra workers, in random order
        let mut ids: Vec<usize> = (0..n).collect();
        let mut rng = SplitMix64(order);
        for i in (1..n).rev() {
            ids.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        ids.truncate((n - s + extra).min(n));
        let a = code.decode(&ids).unwrap();
        prop_assert!(a.iter().all(|(w, _)| ids.contains(w)));
        let mut sum = vec![0.0f64; n];
        for &(w, c) in &a {
            for (p, b) in code.assignment(w) {
                sum[p] += c * b;
            }
        }
        prop_assert!(sum.iter().all(|x| (x - 1.0).abs() < 1e-9), "{:?}", sum);
        let parts = parts(n, 20, seed ^ order);
        let vectors = encode_all(&code, &parts);
        check_decodes(&code, &parts, &vectors, &ids);
    }
}
