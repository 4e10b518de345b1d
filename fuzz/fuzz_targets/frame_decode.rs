//! Any bytes as a frame stream (what a server's socket may receive): the codec, and every
//! control body a node decodes from `meta` (table specs, schedule calls, registrations,
//! vector programs, piece-board calls).
#![no_main]
use downpour_core::codec::{decode_frame, FrameLimits};
use downpour_core::proto;
use downpour_core::table::TableDef;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let limits = FrameLimits { max_payload_bytes: 1 << 20 };
    let mut buf = data;
    // at most 64 frames per input
    for _ in 0..64 {
        match decode_frame(buf, &limits) {
            Ok(Some((h, keys, values, used))) => {
                assert!(used <= buf.len() && used > 0);
                assert_eq!(keys.len() as u64 * 8, h.keys_len);
                assert_eq!(values.len() as u64 * 4, h.values_len);
                if let Ok(spec) = proto::TableSpec::decode(h.meta.as_ref()) {
                    if let Ok(def) = TableDef::from_proto(&spec) {
                        let _ = def.to_proto();
                    }
                }
                let _ = proto::ScheduleRequest::decode(h.meta.as_ref());
                let _ = proto::RegisterRequest::decode(h.meta.as_ref());
                let _ = proto::PieceRequest::decode(h.meta.as_ref());
                if let Ok(p) = proto::VecProgram::decode(h.meta.as_ref()) {
                    if let Ok(instrs) = downpour_core::vecops::program_from_proto(&p) {
                        // run it on small co-partitioned vectors, as a server would
                        let tables = downpour_core::vecops::program_tables(&instrs);
                        let mut store: Vec<Vec<f32>> = tables.iter().map(|_| vec![1.0; 8]).collect();
                        let mut views: Vec<&mut [f32]> = store.iter_mut().map(|v| v.as_mut_slice()).collect();
                        let _ = downpour_core::vecops::execute(&instrs, &tables, &mut views);
                    }
                }
                buf = &buf[used..];
            }
            Ok(None) | Err(_) => break,
        }
    }
});
