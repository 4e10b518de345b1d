use super::*;

/// Data blocks of `m` values, seeded.
fn blocks(k: usize, m: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = SplitMix64(seed);
    (0..k).map(|_| (0..m).map(|_| rng.normal() as f32).collect()).collect()
}

#[test]
fn any_k_of_n_coded_results_decode_every_block() {
    for (n, k) in [(1, 1), (4, 3), (4, 4), (4, 1), (6, 3), (8, 5), (10, 7), (12, 4)] {
        let code = MdsCode::new(MdsSpec { n, k }, 7).unwrap();
        let m = 5;
        let data = blocks(k, m, n as u64 * 31 + k as u64);
        let refs: Vec<&[f32]> = data.iter().map(|b| b.as_slice()).collect();
        let coded: Vec<Vec<f32>> = (0..n).map(|j| code.encode(j, &refs)).collect();
        // every k-subset (few enough here)
        let all = Patterns::new(n, n - k, 1, 10_000);
        assert_eq!(all.0.len() as u128, patterns(code.spec()));
        for missing in &all.0 {
            let got: Vec<usize> = (0..n).rev().filter(|w| !missing.contains(w)).collect();
            let d = code.decoder(&got).unwrap();
            let rs: Vec<&[f32]> = d.workers().iter().map(|&w| coded[w].as_slice()).collect();
            let mut out = vec![0.0; k * m - 2];
            d.decode(&rs, &mut out);
            for (i, o) in out.iter().enumerate() {
                let want = data[i / m][i % m] as f64;
                let tol = 1e-6 * d.amplification() * 4.0;
                assert!((o - want).abs() <= tol, "({n},{k}) missing {missing:?}: value {i} {o} vs {want}");
            }
        }
        assert!(code.amplification() >= 1.0 && code.amplification() < 1e4, "({n},{k}) amplification {}", code.amplification());
    }
}

#[test]
fn plain_blocks_received_are_copied_exactly_and_cost_no_amplification() {
    let code = MdsCode::new(MdsSpec { n: 5, k: 3 }, 1).unwrap();
    let d = code.decoder(&[4, 2, 1, 0, 3]).unwrap();
    assert_eq!(d.workers(), &[0, 1, 2]);
    assert_eq!(d.amplification(), 1.0);
    let data = blocks(3, 4, 9);
    let refs: Vec<&[f32]> = data.iter().map(|b| b.as_slice()).collect();
    let mut out = vec![0.0; 12];
    d.decode(&refs, &mut out);
    assert!(out.iter().zip(data.concat()).all(|(o, v)| *o == v as f64));
}

#[test]
fn too_few_repeated_or_unknown_results_are_refused() {
    let code = MdsCode::new(MdsSpec { n: 4, k: 3 }, 1).unwrap();
    assert!(matches!(code.decoder(&[0, 1]), Err(CoreError::Codec(_))));
    assert!(matches!(code.decoder(&[0, 1, 1]), Err(CoreError::Codec(_))));
    assert!(matches!(code.decoder(&[0, 1, 4]), Err(CoreError::Codec(_))));
}

#[test]
fn specs_parse_and_bad_ones_name_the_form() {
    assert_eq!("mds:4,3".parse::<MdsSpec>().unwrap(), MdsSpec { n: 4, k: 3 });
    assert_eq!(" mds: 4 , 4 ".parse::<MdsSpec>().unwrap().to_string(), "mds:4,4");
    for bad in ["mds:3,4", "mds:4,0", "mds:4", "4,3", "mds:65,3", "mds:a,b"] {
        let e = bad.parse::<MdsSpec>().unwrap_err().to_string();
        assert!(e.contains("mds:N,K"), "{bad}: {e}");
    }
    assert!(MdsCode::new(MdsSpec { n: 3, k: 4 }, 1).is_err());
}

#[test]
fn the_same_seed_builds_the_same_code() {
    let a = MdsCode::new(MdsSpec { n: 7, k: 4 }, 3).unwrap();
    let b = MdsCode::new(MdsSpec { n: 7, k: 4 }, 3).unwrap();
    assert_eq!(a.parity, b.parity);
}

#[test]
fn the_amplification_of_one_parity_block_stays_small() {
    // 4 workers, 3 blocks: the case the lecture's experiment uses
    let code = MdsCode::new(MdsSpec { n: 4, k: 3 }, 1).unwrap();
    assert!(code.amplification() <= 8.0, "{}", code.amplification());
}
