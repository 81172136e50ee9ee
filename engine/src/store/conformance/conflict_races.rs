//! Conformance cases of conflicting copies under concurrency: keepers racing cleanup's delete
//! batches (no copy outlives its record), and the open payload-copy limit under concurrent
//! keepers.

use std::cell::Cell;
use std::time::Duration;

use super::claims::{claim_one, claimed, complete, group, lease, msg, Msg};
use super::roles::copy;
use super::{GROUP, Harness};
use crate::actions::cleanup::DeleteBatch;
use crate::console::console_store;
use crate::store::roles::ConflictCopies;
use crate::store::{ConflictKind, DedupStore, MAX_OPEN_PAYLOAD_COPIES, StoreError};

/// `n` succeeded records forty days old, named `{prefix}.{i}`; their ids.
async fn old_records<H: Harness>(h: &H, prefix: &str, n: usize) -> Vec<i64> {
    let l = lease("w1");
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let m = msg(&format!("{prefix}.{i}"), "ORDER.PAY", "{}");
        let c = claimed(claim_one(h, &m, &l).await);
        complete(h, &[&c], &l).await;
        h.age_record(c.id, 40).await;
        ids.push(c.id);
    }
    ids
}

/// Six keepers (each copy on a connection of its own, as the leased path keeps them) keep
/// payload copies of 150 old succeeded records while two cleanup loops run delete batches of 4
/// over them. Afterwards: no open copy names a deleted record (no orphan), every copy a keeper
/// was told was kept still has its record, every `RecordDeleted` names a record that is gone,
/// no keeper or batch failed otherwise, and the status counts equal the rows.
pub async fn keepers_racing_delete_batches_leave_no_orphan_copy<H: Harness>() {
    const N: usize = 150;
    const KEEPERS: usize = 6;
    const KEEPS_EACH: usize = 60;
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let ids = old_records(&h, "RACE", N).await;
    let batch = DeleteBatch {
        status: "succeeded",
        cutoff: store.cleanup_cutoff(30).await.unwrap(),
        group: None,
        limit: 4,
        fingerprint_days: 1,
    };
    let keepers_left = Cell::new(KEEPERS);
    let group = group();
    let keeper = |k: usize| {
        let (h, ids, group, keepers_left) = (&h, &ids, &group, &keepers_left);
        async move {
            let mut kept = Vec::new();
            let mut gone = Vec::new();
            let mut errors = Vec::new();
            for i in 0..KEEPS_EACH {
                // Walk the records from both ends towards the batches (which go in id order).
                let idx = if k.is_multiple_of(2) { (i * 5 + k) % N } else { N - 1 - (i * 5 + k) % N };
                let other: Msg = msg(&format!("RACE.{idx}"), "ORDER.PAY", &format!("{{\"k\":{k},\"i\":{i}}}"));
                let mut conn = h.store().pool().acquire().await.unwrap();
                match h.store().keep_conflicts(&mut *conn, group, &[copy(ids[idx], &other, ConflictKind::Payload)]).await {
                    Ok(()) => kept.push(idx),
                    Err(StoreError::RecordDeleted(id)) => {
                        assert_eq!(id, ids[idx]);
                        gone.push(idx);
                    }
                    Err(e) => errors.push(format!("keeper {k} copy {i} of record {idx}: {e}")),
                }
            }
            keepers_left.set(keepers_left.get() - 1);
            (kept, gone, errors)
        }
    };
    let cleaner = |c: usize| {
        let (store, batch, keepers_left) = (&store, &batch, &keepers_left);
        async move {
            let mut deleted = 0i64;
            let mut errors = Vec::new();
            while keepers_left.get() > 0 {
                match store.delete_batch(batch).await {
                    Ok(n) => deleted += n,
                    Err(e) => errors.push(format!("cleaner {c}: {e}")),
                }
                tokio::task::yield_now().await;
            }
            (deleted, errors)
        }
    };
    let (keeps, cleans) = tokio::time::timeout(
        Duration::from_secs(120),
        async { tokio::join!(futures::future::join_all((0..KEEPERS).map(keeper)), futures::future::join_all((0..2).map(cleaner))) },
    )
    .await
    .expect("keepers and cleaners finish in 120 s (no hang)");
    let mut problems: Vec<String> = Vec::new();
    let (mut n_kept, mut n_gone) = (0, 0);
    for (kept, gone, errors) in &keeps {
        n_kept += kept.len();
        n_gone += gone.len();
        problems.extend(errors.iter().cloned());
    }
    let deleted: i64 = cleans.iter().map(|(d, _)| d).sum();
    for (_, errors) in &cleans {
        problems.extend(errors.iter().cloned());
    }
    for (idx, id) in ids.iter().enumerate() {
        let present = h.record(GROUP, &format!("RACE.{idx}")).await.is_some();
        let open = h.conflicts(*id).await.iter().filter(|c| c.open).count();
        if !present && open > 0 {
            problems.push(format!("ORPHAN: record {id} (RACE.{idx}) deleted with {open} open copies"));
        }
        if !present && keeps.iter().any(|(kept, _, _)| kept.contains(&idx)) {
            problems.push(format!("record {id} (RACE.{idx}) deleted although a copy was kept on it"));
        }
        if present && keeps.iter().any(|(_, gone, _)| gone.contains(&idx)) {
            problems.push(format!("record {id} (RACE.{idx}) present although a keeper was told it was deleted"));
        }
    }
    eprintln!("[{}] kept {n_kept}, told deleted {n_gone}, records deleted {deleted}", H::NAME);
    let counted = h.counted().await;
    let actual = h.actual().await;
    if counted != actual {
        problems.push(format!("record_counts drifted: counted {counted:?}, actual {actual:?}"));
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    assert!(n_gone > 0 && n_kept > 0 && deleted > 0, "the race ran: kept {n_kept}, gone {n_gone}, deleted {deleted}");
}

/// Eight copies of one record, each with a payload of its own, kept at once on connections of
/// their own (eight leased batches, each with one conflicting delivery): the record keeps at
/// most [`MAX_OPEN_PAYLOAD_COPIES`] open payload conflicts. Ten records, to give the race room.
pub async fn distinct_payload_copies_kept_at_once_stay_within_the_open_limit<H: Harness>() {
    let h = H::fresh().await;
    let ids = old_records(&h, "CAP", 10).await;
    let group = group();
    let mut over = Vec::new();
    for (r, id) in ids.iter().enumerate() {
        let others: Vec<Msg> =
            (0..8).map(|i| msg(&format!("CAP.{r}"), "ORDER.PAY", &format!("{{\"n\":{i}}}"))).collect();
        let (h, group, id) = (&h, &group, *id);
        let results = futures::future::join_all(others.iter().map(|o| async move {
            let mut conn = h.store().pool().acquire().await?;
            h.store().keep_conflicts(&mut *conn, group, &[copy(id, o, ConflictKind::Payload)]).await
        }))
        .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let open = h.conflicts(id).await.iter().filter(|c| c.open && c.kind == "payload").count();
        if i64::try_from(open).unwrap() > MAX_OPEN_PAYLOAD_COPIES {
            over.push((id, open));
        }
    }
    assert!(over.is_empty(), "records over the open payload-copy limit of {MAX_OPEN_PAYLOAD_COPIES}: {over:?}");
}
