//! `train lda` end to end on a corpus generated from known topics.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

/// Writes 90 documents drawn from 3 topics whose words are disjoint (topic t uses the
/// words named `t-0` … `t-14`, ids `15t` … `15t + 14`): each document has 40 tokens, 90%
/// from its main topic and 10% from another.
fn write_corpus(corpus: &Path, vocab: &Path) {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut below = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut text = String::new();
    for d in 0..90u64 {
        let mut counts = [0u32; 45];
        for _ in 0..40 {
            let topic = if below(10) == 0 { (d + 1 + below(2)) % 3 } else { d % 3 };
            counts[(topic * 15 + below(15)) as usize] += 1;
        }
        let words: Vec<String> = counts.iter().enumerate().filter(|c| *c.1 > 0).map(|(w, c)| format!("{w}:{c}")).collect();
        writeln!(text, "{} {}", words.len(), words.join(" ")).unwrap();
    }
    std::fs::write(corpus, text).unwrap();
    let names: Vec<String> = (0..45).map(|w| format!("{}-{}", w / 15, w % 15)).collect();
    std::fs::write(vocab, names.join("\n") + "\n").unwrap();
}

fn train(corpus: &Path, vocab: &Path, out: &Path, workers: &str) -> (serde_json::Value, String) {
    let o = downpour()
        .args(["train", "lda", "--train", corpus.to_str().unwrap(), "--vocab", vocab.to_str().unwrap(), "--workers", workers])
        .args(["--topics", "3", "--sweeps", "60", "--top-words", "5", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}{stdout}", String::from_utf8_lossy(&o.stderr));
    (serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap(), stdout)
}

#[test]
fn model_parallel_lda_finds_the_hidden_topics_with_one_worker_and_with_two() {
    let d = tempfile::tempdir().unwrap();
    let (corpus, vocab, out) = (d.path().join("c.ldac"), d.path().join("vocab"), d.path().join("m.json"));
    write_corpus(&corpus, &vocab);
    let mut finals = Vec::new();
    for workers in ["1", "2"] {
        let (m, stdout) = train(&corpus, &vocab, &out, workers);
        assert_eq!((m["tokens"].as_u64(), m["documents"].as_u64(), m["vocabulary"].as_u64()), (Some(3600), Some(90), Some(45)), "{m}");
        let evals = m["evals"].as_array().unwrap();
        assert_eq!(evals.len(), 6, "{m}");
        let (first, last) = (evals[0]["ll_per_token"].as_f64().unwrap(), m["ll_per_token"].as_f64().unwrap());
        assert!(last.is_finite() && last < 0.0, "{m}");
        // a topic's 5 top words all come from one hidden topic, and every hidden topic is found
        let mut found: Vec<char> = m["top_words"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let words: Vec<&str> = t.as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
                assert_eq!(words.len(), 5, "{m}");
                let hidden = words[0].chars().next().unwrap();
                assert!(words.iter().all(|w| w.starts_with(hidden)), "{workers} workers: a mixed topic {words:?}");
                hidden
            })
            .collect();
        found.sort_unstable();
        assert_eq!(found, ['0', '1', '2'], "{workers} workers: {m}");
        assert!(stdout.contains("topic 0: ") && stdout.contains("train lda: ll_per_token="), "{stdout}");
        // the log-likelihood of the hidden topics' assignment (90% of each document's
        // tokens on one topic of 15 equally likely words) is about -3.4 per token; the
        // random start is far below it
        assert!(last > -3.6 && first <= last, "{workers} workers: {first} -> {last}");
        finals.push(last);
    }
    assert!((finals[0] - finals[1]).abs() < 0.01 * finals[0].abs(), "1 worker {}, 2 workers {}", finals[0], finals[1]);
}

#[test]
fn a_bad_corpus_line_is_named_and_word_ids_beyond_the_vocabulary_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let (corpus, vocab) = (d.path().join("c.ldac"), d.path().join("vocab"));
    std::fs::write(&corpus, "2 0:1 1:2\n2 1:1 x:3\n").unwrap();
    let o = downpour().args(["train", "lda", "--train", corpus.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("c.ldac:2") && err.contains("\"x:3\""), "{err}");
    std::fs::write(&corpus, "2 0:1 1:2\n1 7:1\n").unwrap();
    std::fs::write(&vocab, "a\nb\nc\n").unwrap();
    let o = downpour().args(["train", "lda", "--train", corpus.to_str().unwrap(), "--vocab", vocab.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("word id 7 is beyond the vocabulary's 3 words"), "{err}");
    let o = downpour().args(["train", "lda", "--train", corpus.to_str().unwrap(), "--topics", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--topics"), "{err}");
}
