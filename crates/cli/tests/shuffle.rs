//! `train shuffle`: coded and uncoded shuffles deal the same rows (the models are equal bit
//! for bit), coding sends fewer messages, both counts are near the formula, the learners
//! decode exactly their missing rows, a file sorted by label trains a worse model unshuffled,
//! and bad flags and data get clear errors.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

fn run(args: &[&str]) -> Output {
    let o = downpour().args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}\nstdout: {}\nstderr: {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    o
}

fn fails(args: &[&str]) -> String {
    let o = downpour().args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A LIBSVM file of `n` examples sorted by label (the first 5/8 negative), each with 12
/// features drawn mostly from its class's half of 200 ids; some lines end in a comment whose
/// bytes are not ASCII (they travel with the row).
fn sorted_file(dir: &Path, name: &str, n: usize, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    for i in 0..n {
        let positive = i >= n * 5 / 8;
        let mut ids: Vec<usize> = (0..12)
            .map(|_| {
                let own = next() % 10 < 7;
                let low = positive == own;
                1 + next() % 100 + if low { 0 } else { 100 }
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let feats: Vec<String> = ids.iter().map(|j| format!("{j}:0.3")).collect();
        write!(f, "{} {}", u8::from(positive), feats.join(" ")).unwrap();
        if i % 3 == 0 {
            write!(f, " # Ã\u{7f}.Ã\u{7f}..Ã\u{7f}...Ã\u{7f} {i}").unwrap();
        }
        writeln!(f).unwrap();
    }
    path
}

fn metrics(args: &[&str], dir: &Path, name: &str) -> serde_json::Value {
    let out = dir.join(name);
    let mut all = vec!["train", "shuffle"];
    all.extend(args);
    all.extend(["--quiet", "--out", out.to_str().unwrap()]);
    run(&all);
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn coded_and_uncoded_shuffles_train_the_same_model_and_coding_sends_fewer_messages() {
    let d = tempfile::tempdir().unwrap();
    let train = sorted_file(d.path(), "train.svm", 1600, 1);
    let test = sorted_file(d.path(), "test.svm", 400, 2);
    let base = [
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--workers",
        "5",
        "--epochs",
        "4",
        "--cache-fraction",
        "0.5",
    ];
    let unc = metrics(&[&base[..], &["--shuffle", "uncoded"]].concat(), d.path(), "uncoded.json");
    let cod = metrics(&[&base[..], &["--shuffle", "coded"]].concat(), d.path(), "coded.json");
    // the same deal and the same rows: the averaged models are equal bit for bit
    assert_eq!(unc["final"], cod["final"], "coded {cod}\nuncoded {unc}");
    assert_eq!(f(&unc["learners"]), 4.0);
    for e in 1..4 {
        let (u, c) = (&unc["trace"][e]["shuffle"], &cod["trace"][e]["shuffle"]);
        // every learner decoded exactly the rows it missed, one message each
        assert_eq!(u["learner_messages"], u["messages"], "{u}");
        assert_eq!(c["learner_messages"], u["messages"], "coded learners decoded {c} against uncoded {u}");
        assert!(f(&c["messages"]) < 0.6 * f(&u["messages"]), "coded {c} against uncoded {u}");
        assert!(f(&c["master_bytes"]) < 0.7 * f(&u["master_bytes"]), "coded {c} against uncoded {u}");
        for x in [u, c] {
            let (got, want) = (f(&x["messages"]), f(&x["expected_messages"]));
            assert!((got / want - 1.0).abs() < 0.15, "{got} messages against the formula's {want}: {x}");
        }
    }
    assert!(unc["trace"][0]["shuffle"].is_null(), "epoch 0 trains on the blocks as loaded");
    let load = &unc["load"];
    assert_eq!(load["learner_messages"], load["messages"], "{load}");
    assert!(f(&unc["final"]["test_auc"]) > 0.9, "{unc}");
}

#[test]
fn a_file_sorted_by_label_trains_a_worse_model_unshuffled() {
    let d = tempfile::tempdir().unwrap();
    let train = sorted_file(d.path(), "train.svm", 1600, 3);
    let test = sorted_file(d.path(), "test.svm", 400, 4);
    // one averaging per epoch: each learner's local SGD sees only its block
    let base =
        ["--train", train.to_str().unwrap(), "--test", test.to_str().unwrap(), "--workers", "5", "--epochs", "6", "--local-steps", "1000"];
    let none = metrics(&[&base[..], &["--shuffle", "none"]].concat(), d.path(), "none.json");
    let cod = metrics(&[&base[..], &["--shuffle", "coded"]].concat(), d.path(), "coded.json");
    let (a, b) = (f(&none["final"]["test_logloss"]), f(&cod["final"]["test_logloss"]));
    // deterministic (bsp averaging in rank order): 0.369 against 0.392 when written
    assert!(b < 0.97 * a, "shuffled test log loss {b} against unshuffled {a}");
    assert_eq!(f(&none["per_shuffle"]["messages"]), 0.0);
}

#[test]
fn bad_flags_and_data_get_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let train = sorted_file(d.path(), "train.svm", 100, 5);
    let t = train.to_str().unwrap();
    let e = fails(&["train", "shuffle", "--train", t, "--workers", "1"]);
    assert!(e.contains("master and at least one learner"), "{e}");
    let e = fails(&["train", "shuffle", "--train", t, "--workers", "5", "--cache-fraction", "0.1"]);
    assert!(e.contains("--cache-fraction 0.1") && e.contains("1/4 to 1"), "{e}");
    let e = fails(&["train", "shuffle", "--train", t, "--shuffle", "broadcast"]);
    assert!(e.contains("none, uncoded or coded"), "{e}");
    let bad = d.path().join("bad.svm");
    let mut text = std::fs::read_to_string(&train).unwrap();
    text.push_str("1 5:0.3 x:y\n");
    std::fs::write(&bad, text).unwrap();
    let e = fails(&["train", "shuffle", "--train", bad.to_str().unwrap(), "--workers", "3"]);
    assert!(e.contains("bad.svm") && e.contains("101"), "{e}");
}
