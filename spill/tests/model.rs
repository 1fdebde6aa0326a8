//! Property test: random insert / take / with / remove sequences against a model.

mod common;

use std::collections::HashMap;

use common::{contents, files_in, msg};
use ferrylink_spill::{SpillConfig, SpillStore};
use proptest::prelude::*;

const HOST_BUDGET: usize = 800;

#[derive(Debug, Clone)]
enum Op {
    Insert { key: u8, sizes: Vec<usize>, seed: u8 },
    Take(u8),
    TakeHost(u8),
    With(u8),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop::collection::vec(0usize..500, 0..3), any::<u8>())
            .prop_map(|(key, sizes, seed)| Op::Insert { key, sizes, seed }),
        2 => (0u8..6).prop_map(Op::Take),
        1 => (0u8..6).prop_map(Op::TakeHost),
        2 => (0u8..6).prop_map(Op::With),
        1 => (0u8..6).prop_map(Op::Remove),
    ]
}

type Contents = (Vec<u8>, Vec<Vec<u8>>);

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_a_map(ops in prop::collection::vec(op(), 1..30)) {
        let tmp = tempfile::tempdir().unwrap();
        let store: SpillStore<u8> = SpillStore::new(SpillConfig::new(0, HOST_BUDGET, tmp.path())).unwrap();
        let dir = store.dir().to_path_buf();
        let mut model: HashMap<u8, Contents> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert { key, sizes, seed } => {
                    let header = vec![key, seed];
                    store.insert(key, msg(&header, &sizes, seed)).unwrap();
                    model.insert(key, contents(&msg(&header, &sizes, seed)));
                }
                Op::Take(key) | Op::TakeHost(key) => {
                    let got = if matches!(op, Op::Take(_)) { store.take(&key) } else { store.take_host(&key) };
                    let got = got.unwrap().map(|m| contents(&m));
                    prop_assert_eq!(got, model.remove(&key));
                }
                Op::With(key) => {
                    let got = store.with(&key, contents).unwrap();
                    prop_assert_eq!(got.as_ref(), model.get(&key));
                }
                Op::Remove(key) => {
                    prop_assert_eq!(store.remove(&key), model.remove(&key).is_some());
                }
            }
            let st = store.stats();
            prop_assert_eq!(store.len(), model.len());
            prop_assert!(st.host.bytes <= HOST_BUDGET, "host bytes {} over budget", st.host.bytes);
            prop_assert_eq!(st.device, Default::default());
            prop_assert_eq!(st.host.entries + st.disk.entries, model.len());
            let payload: usize = model.values().map(|c| c.1.iter().map(Vec::len).sum::<usize>()).sum();
            prop_assert_eq!(st.host.bytes + st.disk.bytes, payload);
            prop_assert_eq!(files_in(&dir).len(), st.disk.entries, "one file per disk entry, no temp files");
            for k in 0..6u8 {
                prop_assert_eq!(store.contains(&k), model.contains_key(&k));
            }
        }
        drop(store);
        prop_assert!(!dir.exists(), "directory removed on drop");
        prop_assert!(files_in(tmp.path()).is_empty());
    }
}
