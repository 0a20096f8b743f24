//! The audit store's batches, on both stores: a batch reaches the database
//! as one statement per table, and every record of it still gets its own
//! outcome. A token claimed twice in one batch, a token used before it, a
//! deny-listed identity and a record the database refuses sit next to fresh
//! records; each is answered as itself while the others commit, through the
//! store and through the group-commit writer, and what is read back is
//! exactly what was written (lists, absent values, large batches). And the
//! connections to Postgres send a batch's message at once: sqlx-core (from
//! 0.9.1) sets `TCP_NODELAY`, and without it a batch larger than one TLS
//! record waits 40 ms for a delayed ACK.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;

use talos_sso_server::audit::store::{
    Append, Appended, AuditStore, DenyChange, DenyEntry, LockAhead, StoreError, StoreOptions, TokenClaim,
};
use talos_sso_server::audit::writer::{AuditError, AuditWriter, MAX_BATCH};
use talos_sso_server::audit::{AuditRecord, StoredRecord, event, outcome};
use talos_sso_tests::harness::{Backend, BareStore};
use time::OffsetDateTime;

/// A fresh store of one kind.
struct Store {
    store: AuditStore,
    bare: BareStore,
}

impl Store {
    async fn open(backend: Backend) -> Self {
        let bare = BareStore::open(backend).await;
        Self {
            store: bare.store.clone(),
            bare,
        }
    }

    /// A rule the sanitised records cannot break on their own: the
    /// database refuses any record naming `username`.
    async fn refuse_username(&self, username: &str) {
        match &self.store {
            AuditStore::Postgres(pool) => {
                let sql = format!(
                    "ALTER TABLE audit_events ADD CONSTRAINT refuse_{username} \
                     CHECK (username IS DISTINCT FROM '{username}')"
                );
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(pool)
                    .await
                    .unwrap();
            }
            AuditStore::Sqlite(sqlite) => {
                let pool = sqlite.pool();
                let sql = format!(
                    "CREATE TRIGGER refuse_{username} BEFORE INSERT ON audit_events \
                     WHEN NEW.username = '{username}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
                );
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(pool)
                    .await
                    .unwrap();
            }
        }
    }

    /// The claimed token ids, sorted.
    async fn used_tokens(&self) -> Vec<String> {
        let sql = "SELECT token_id FROM used_tokens ORDER BY token_id";
        match &self.store {
            AuditStore::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
            AuditStore::Sqlite(sqlite) => sqlx::query_scalar(sql).fetch_all(sqlite.pool()).await.unwrap(),
        }
    }

    /// Every record after `after`, in order.
    async fn records_after(&self, mut after: i64) -> Vec<StoredRecord> {
        let mut all = Vec::new();
        loop {
            let page = self.store.page(after, 1000).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.seq;
            all.extend(page);
        }
        all
    }

    async fn finish(self) {
        let check = self.store.verify_chain().await.unwrap();
        assert_eq!(check.first_broken, None);
        self.bare.close().await;
    }
}

/// An issuance by `username` (subject `{username}-oid`) with token `token`,
/// checked against the deny list, as the issuance service appends it.
fn issuance(username: &str, token: &str) -> Append {
    let mut record = AuditRecord::new(
        event::CERTIFICATE_ISSUED,
        outcome::SUCCESS,
        &format!("req-{username}-{token}"),
        OffsetDateTime::now_utc(),
    );
    record.subject = Some(format!("{username}-oid"));
    record.username = Some(username.into());
    record.identity_verified = true;
    record.cluster = Some("prod".into());
    record.groups_evaluated = vec!["oncall".into(), "platform".into()];
    record.roles_requested = vec![];
    record.roles_granted = vec!["os:operator".into()];
    record.serial = Some(format!("{token}-serial"));
    record.token_id = Some(token.into());
    Append {
        record,
        claim: Some(TokenClaim {
            token_id: token.into(),
            expires_at: Some(OffsetDateTime::now_utc() + time::Duration::minutes(5)),
            uses: 1,
        }),
        deny_check: true,
        deny_change: None,
    }
}

/// An administrator puts `username`'s subject on the deny list.
fn deny(username: &str) -> Append {
    let mut record = AuditRecord::new(
        event::DENY_ADDED,
        outcome::SUCCESS,
        &format!("req-deny-{username}"),
        OffsetDateTime::now_utc(),
    );
    record.username = Some("admin".into());
    Append {
        record,
        deny_change: Some(DenyChange::Add(DenyEntry {
            subject: Some(format!("{username}-oid")),
            username: None,
            reason: "investigation".into(),
            added_by: "admin".into(),
            added_at: OffsetDateTime::now_utc(),
            expires_at: None,
        })),
        ..Default::default()
    }
}

/// Before each test's batch: `t0` is used, and `mallet` is deny-listed.
async fn used_and_denied(store: &Store) {
    store
        .store
        .append_batch(&[issuance("alice", "t0"), deny("mallet")])
        .await
        .unwrap();
}

fn kind(appended: &Appended) -> &'static str {
    match appended {
        Appended::Recorded(_) => "recorded",
        Appended::Replayed(_) => "replayed",
        Appended::Denied(_) => "denied",
    }
}

/// Every future polled in one go, each to its end: all of them start (for
/// appends: queue their job) in the same poll, before anything else on
/// this runtime runs, so the writer finds them queued together.
async fn all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

/// One `append_batch`: fresh claims, a token claimed twice, a token used
/// before, a deny-listed identity and a record without a claim, each with
/// its outcome, in one transaction; read back exactly as returned.
async fn one_batch_gives_each_record_its_own_outcome(backend: Backend) {
    let store = Store::open(backend).await;
    used_and_denied(&store).await;
    let (head, _) = store.store.head().await.unwrap();
    let mut break_glass = AuditRecord::new(
        event::BREAK_GLASS_ISSUED,
        outcome::SUCCESS,
        "req-break-glass",
        OffsetDateTime::now_utc(),
    );
    break_glass.username = Some("break-glass:root@host".into());
    let batch = [
        issuance("alice", "t1"),
        issuance("bob", "t1"),
        issuance("bob", "t0"),
        issuance("mallet", "t2"),
        issuance("carol", "t3"),
        Append {
            record: break_glass,
            ..Default::default()
        },
    ];
    let appended = store.store.append_batch(&batch).await.unwrap();
    let kinds: Vec<&str> = appended.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "recorded", "replayed", "replayed", "denied", "recorded", "recorded"
        ],
        "{backend:?}"
    );
    let reasons: Vec<Option<&str>> = appended
        .iter()
        .map(|a| a.stored().record.reason_code.as_deref())
        .collect();
    assert_eq!(
        reasons,
        [
            None,
            Some("token_replayed"),
            Some("token_replayed"),
            Some("identity_denied"),
            None,
            None
        ]
    );
    // A replay or a denial is recorded as a denial, never as an issuance.
    for denial in &appended[1..4] {
        assert_eq!(denial.stored().record.event, event::CERTIFICATE_DENIED);
    }
    // Only fresh, allowed records claim their token: not the denied one.
    assert_eq!(store.used_tokens().await, ["t0", "t1", "t3"], "{backend:?}");
    let stored: Vec<StoredRecord> = appended.iter().map(|a| a.stored().clone()).collect();
    assert_eq!(store.records_after(head).await, stored, "{backend:?}");
    assert_eq!(stored[0].seq, head + 1);
    store.finish().await;
}

/// A claim is made only for a record no deny-list entry blocks, here an
/// entry without a subject, which matches the username lower-cased. A
/// token first named by a blocked record is fresh for the next record that
/// is allowed, and a replay after that; a blocked record's token stays
/// unused.
async fn a_claim_is_made_only_for_a_record_no_entry_blocks(backend: Backend) {
    let store = Store::open(backend).await;
    let mut by_name = deny("eve");
    if let Some(DenyChange::Add(entry)) = &mut by_name.deny_change {
        entry.subject = None;
        entry.username = Some("Eve".into());
    }
    store.store.append_batch(&[by_name]).await.unwrap();
    let batch = [
        issuance("EVE", "s1"),
        issuance("frank", "s1"),
        issuance("frank", "s1"),
        issuance("eve", "s2"),
        issuance("EVE", "s4"),
        issuance("grace", "s3"),
    ];
    let appended = store.store.append_batch(&batch).await.unwrap();
    let kinds: Vec<&str> = appended.iter().map(kind).collect();
    assert_eq!(
        kinds,
        ["denied", "recorded", "replayed", "denied", "denied", "recorded"],
        "{backend:?}"
    );
    assert_eq!(store.used_tokens().await, ["s1", "s3"], "{backend:?}");
    // The token of a blocked record is still unused: once the entry is
    // gone, it is fresh.
    let unblock = Append {
        deny_change: Some(DenyChange::Remove {
            subject: None,
            username: Some("eve".into()),
        }),
        ..deny("admin")
    };
    store.store.append_batch(&[unblock]).await.unwrap();
    let appended = store.store.append_batch(&[issuance("eve", "s2")]).await.unwrap();
    assert_eq!(kind(&appended[0]), "recorded", "{backend:?}");
    store.finish().await;
}

/// A batch the database refuses for one record's content commits nothing:
/// no record, no token claim, so that it can be written again record by
/// record with the same answers.
async fn a_refused_batch_leaves_nothing_behind(backend: Backend) {
    let store = Store::open(backend).await;
    used_and_denied(&store).await;
    store.refuse_username("mallory").await;
    let before = store.store.head().await.unwrap();
    let batch = [
        issuance("alice", "t1"),
        issuance("mallory", "t2"),
        issuance("carol", "t3"),
    ];
    let refused = store.store.append_batch(&batch).await;
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "{backend:?}: {refused:?}"
    );
    assert_eq!(store.store.head().await.unwrap(), before);
    assert_eq!(store.used_tokens().await, ["t0"]);
    // Without the refused record, the same tokens are still fresh.
    let appended = store
        .store
        .append_batch(&[issuance("alice", "t1"), issuance("carol", "t3")])
        .await
        .unwrap();
    assert_eq!(
        appended.iter().map(kind).collect::<Vec<_>>(),
        ["recorded", "recorded"]
    );
    assert_eq!(store.used_tokens().await, ["t0", "t1", "t3"]);
    store.finish().await;
}

/// Through the writer: requests queued together are one batch. Without a
/// bad record it commits in one transaction; with one, the batch is
/// written again record by record and every request still gets its own
/// answer: the replays and the denial as such, the refused record refused
/// (with a stand-in in the trail), the others committed.
async fn the_writer_answers_each_request_of_a_mixed_batch(backend: Backend) {
    let store = Store::open(backend).await;
    used_and_denied(&store).await;
    store.refuse_username("mallory").await;
    let (head, _) = store.store.head().await.unwrap();
    let (writer, task) = AuditWriter::start(store.store.clone(), Box::new(|_, _| {}));
    let stats = writer.stats().clone();

    let batch = vec![
        issuance("alice", "t1"),
        issuance("bob", "t1"),
        issuance("bob", "t0"),
        issuance("mallet", "t2"),
        issuance("carol", "t3"),
    ];
    let answers = all(batch.into_iter().map(|a| writer.append(a)).collect()).await;
    let kinds: Vec<&str> = answers.iter().map(|a| kind(a.as_ref().unwrap())).collect();
    assert_eq!(
        kinds,
        ["recorded", "replayed", "replayed", "denied", "recorded"],
        "{backend:?}"
    );
    assert_eq!(
        (
            stats.batches.load(Ordering::Relaxed),
            stats.records.load(Ordering::Relaxed)
        ),
        (1, 5),
        "{backend:?}: the five requests are one transaction"
    );

    let batch = vec![
        issuance("dave", "t4"),
        issuance("erin", "t4"),
        issuance("erin", "t0"),
        issuance("mallet", "t5"),
        issuance("mallory", "t6"),
        issuance("frank", "t7"),
    ];
    let answers = all(batch.into_iter().map(|a| writer.append(a)).collect()).await;
    let kinds: Vec<&str> = answers
        .iter()
        .map(|a| match a {
            Ok(appended) => kind(appended),
            Err(AuditError::Unavailable) => "refused",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "recorded", "replayed", "replayed", "denied", "refused", "recorded"
        ],
        "{backend:?}"
    );
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
    // Each answered record is in the trail at its place.
    let answered: Vec<StoredRecord> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|a| a.stored().clone()))
        .collect();
    let rows = store.records_after(head).await;
    for record in &answered {
        assert!(
            rows.contains(record),
            "{backend:?}: seq {} is not as answered",
            record.seq
        );
    }
    // Ten answered records, and the refused one's stand-in.
    assert_eq!(rows.len(), 11, "{backend:?}");
    let standin: Vec<&StoredRecord> = rows
        .iter()
        .filter(|r| r.record.event == event::RECORD_REFUSED)
        .collect();
    assert_eq!(standin.len(), 1);
    assert_eq!(standin[0].record.request_id, "req-mallory-t6");
    assert_eq!(standin[0].record.details["event"], event::CERTIFICATE_ISSUED);
    // Neither the refused record nor the denied ones claimed their token.
    assert_eq!(
        store.used_tokens().await,
        ["t0", "t1", "t3", "t4", "t7"],
        "{backend:?}"
    );
    drop(writer);
    task.await.unwrap();
    store.finish().await;
}

/// Awkward list items: separators and quotes of array and JSON syntax,
/// words SQL treats specially, text beyond ASCII, the empty string.
const ITEMS: [&str; 8] = [
    "os:operator",
    "a,b",
    "{x}",
    "\"quoted\"",
    "back\\slash",
    "NULL",
    "ünïcødé ✓",
    "",
];

/// A batch larger than any the writer makes (and than one SQLite
/// statement's placeholders allow): lists of every length (none
/// included) with awkward items, absent and present values, claims with
/// replays among them; every record reads back as written.
async fn a_large_batch_reads_back_as_written(backend: Backend) {
    let store = Store::open(backend).await;
    let count = 1_500;
    let batch: Vec<Append> = (0..count)
        .map(|i| {
            // Every seventh request replays the token of the one before.
            let token = if i % 7 == 6 { i - 1 } else { i };
            let mut append = issuance(&format!("user{}", i % 13), &format!("tok-{token}"));
            let list = |n: usize| (0..n).map(|k| ITEMS[(i + k) % ITEMS.len()].to_owned()).collect();
            append.record.groups_evaluated = list(i % 5);
            append.record.roles_requested = list((i / 5) % 3);
            append.record.roles_granted = list((i / 15) % 4);
            if i % 3 == 0 {
                append.record.subject = None;
                append.record.serial = None;
                append.record.not_before = None;
                append.record.token_issued_at = Some(OffsetDateTime::UNIX_EPOCH);
            } else {
                append.record.not_before = Some(OffsetDateTime::now_utc());
                append.record.not_after = Some(OffsetDateTime::now_utc() + time::Duration::minutes(5));
            }
            append.record.details = serde_json::json!({"n": i, "item": ITEMS[i % ITEMS.len()]});
            append
        })
        .collect();
    let appended = store.store.append_batch(&batch).await.unwrap();
    let replayed = appended
        .iter()
        .filter(|a| matches!(a, Appended::Replayed(_)))
        .count();
    assert_eq!(replayed, count / 7, "{backend:?}");
    assert_eq!(store.used_tokens().await.len(), count - count / 7);
    let stored: Vec<StoredRecord> = appended.iter().map(|a| a.stored().clone()).collect();
    let read = store.records_after(0).await;
    assert_eq!(read.len(), count);
    for (read, written) in read.iter().zip(&stored) {
        assert_eq!(read, written, "{backend:?}: seq {}", written.seq);
    }
    // The lists are the ones asked for, not merely consistent with their
    // hash (a replay is recorded granting nothing).
    for (read, append) in read.iter().zip(&batch) {
        assert_eq!(read.record.groups_evaluated, append.record.groups_evaluated);
        assert_eq!(read.record.roles_requested, append.record.roles_requested);
        if read.record.outcome == outcome::SUCCESS {
            assert_eq!(read.record.roles_granted, append.record.roles_granted);
        } else {
            assert!(read.record.roles_granted.is_empty());
        }
    }
    store.finish().await;
}

/// A workload's token may be claimed `uses` times: each use is recorded
/// under a key of its own, in one batch or across batches, until every key
/// is taken; then it is a replay like a person's second use. A person's
/// token with the same id is a key of its own only if its id differs.
async fn a_workload_token_is_claimed_up_to_its_uses(backend: Backend) {
    let store = Store::open(backend).await;
    let workload = |n: u32| {
        let mut append = issuance(&format!("job-{n}"), "ci:jti-1");
        append.claim.as_mut().unwrap().uses = 3;
        append
    };
    let first = store
        .store
        .append_batch(&[workload(1), workload(2)])
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(kind).collect::<Vec<_>>(),
        ["recorded", "recorded"]
    );
    let next = store
        .store
        .append_batch(&[workload(3), workload(4), issuance("person", "ci:jti-1")])
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(kind).collect::<Vec<_>>(),
        ["recorded", "replayed", "replayed"],
        "{backend:?}: three uses, then none; a single-use claim of the first key is a replay"
    );
    assert_eq!(
        store.used_tokens().await,
        ["ci:jti-1", "ci:jti-1#2", "ci:jti-1#3"]
    );
    store.finish().await;
}

on_both_stores!(
    a_workload_token_is_claimed_up_to_its_uses,
    one_batch_gives_each_record_its_own_outcome,
    a_claim_is_made_only_for_a_record_no_entry_blocks,
    a_refused_batch_leaves_nothing_behind,
    the_writer_answers_each_request_of_a_mixed_batch,
    a_large_batch_reads_back_as_written,
    a_busy_writer_answers_every_request_on_one_chain,
    the_writer_commits_while_the_requests_runtime_is_blocked,
);

/// A second replica's store on the same Postgres database as `store`.
async fn replica_of(store: &Store) -> AuditStore {
    let url = &store.bare.database.as_ref().expect("a Postgres store").url;
    AuditStore::connect(url, &StoreOptions::default()).await.unwrap()
}

/// Postgres takes the next batch's chain lock while a batch commits
/// (`LockAhead`). Each lock taken ahead carries the next batch, which
/// extends the chain from the commit before it, while another replica
/// appends through the same lock all along, its records landing between
/// the batches: a transaction begun ahead without the lock, or reading the
/// head before the lock was granted, forks the chain (a duplicate `seq`,
/// or a hash that does not follow). The database's default isolation is
/// `REPEATABLE READ` here, under which a transaction that did not ask for
/// `READ COMMITTED` takes its snapshot as the lock is requested, before
/// the commit it waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_ahead_carries_the_next_batch_on_the_chain() {
    let bare = Store::open(Backend::Postgres).await;
    let name = &bare.bare.database.as_ref().unwrap().name;
    let sql = format!("ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(postgres_pool(&bare))
        .await
        .unwrap();
    // Pools opened after the change: every connection has the default.
    let store = replica_of(&bare).await;
    let replica = replica_of(&bare).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = tokio::spawn({
        let done = done.clone();
        async move {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                replica
                    .append_batch(&[issuance("rita", &format!("r{i}"))])
                    .await
                    .unwrap();
                i += 1;
            }
            replica.close().await;
            i
        }
    });
    let mut ahead = None;
    for i in 0..40 {
        let batch = [
            issuance("alice", &format!("a{i}")),
            issuance("bob", &format!("b{i}")),
        ];
        let (written, next) = store.append_batch_ahead(&batch, ahead.take(), || true).await;
        let kinds: Vec<&str> = written.unwrap().iter().map(kind).collect();
        assert_eq!(kinds, ["recorded", "recorded"]);
        assert!(
            next.is_some(),
            "batch {i}: records were said to wait, and no lock was taken ahead"
        );
        ahead = next;
    }
    drop(ahead);
    done.store(true, Ordering::Relaxed);
    let replicated = other.await.unwrap();
    store.close().await;
    let rows = bare.records_after(0).await;
    assert_eq!(rows.len(), 40 * 2 + replicated);
    assert!(
        rows.iter().zip(1..).all(|(r, seq)| r.seq == seq),
        "seq runs 1, 2, 3, ..."
    );
    let named = |name: &str, r: &StoredRecord| r.record.username.as_deref() == Some(name);
    let alice: Vec<i64> = rows.iter().filter(|r| named("alice", r)).map(|r| r.seq).collect();
    let (first, last) = (alice[0], alice[alice.len() - 1]);
    assert!(
        rows.iter()
            .any(|r| named("rita", r) && first < r.seq && r.seq < last),
        "the other replica's records all landed before or after the batches"
    );
    bare.finish().await;
}

/// Another replica appends a record within two seconds, well inside
/// `WRITE_TIMEOUT` (the chain lock is free), and it lands at `seq`.
async fn another_replica_appends_at_once(store: &Store, seq: i64) {
    let replica = replica_of(store).await;
    let appended = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        replica.append_batch(&[issuance("rita", &format!("replica-{seq}"))]),
    )
    .await
    .expect("the other replica gets the chain lock")
    .unwrap();
    assert_eq!(appended[0].stored().seq, seq);
    replica.close().await;
}

/// The Postgres pool of a Postgres store.
fn postgres_pool(store: &Store) -> &sqlx::PgPool {
    match &store.store {
        AuditStore::Postgres(pool) => pool,
        AuditStore::Sqlite(_) => panic!("a Postgres store"),
    }
}

/// A lock taken ahead whose connection broke while it waited for the lock
/// (here: its backend terminated, queued behind another replica's
/// transaction) began nothing; the batch it was for begins afresh and
/// commits.
#[tokio::test]
async fn a_batch_whose_lock_ahead_broke_begins_afresh() {
    let store = Store::open(Backend::Postgres).await;
    let pool = postgres_pool(&store).clone();
    let lock = "BEGIN; SELECT pg_advisory_xact_lock(8386103207072584527)";
    let waiting = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let waiters = |count: usize| {
        let pool = pool.clone();
        async move {
            loop {
                let pids: Vec<i32> = sqlx::query_scalar(waiting).fetch_all(&pool).await.unwrap();
                if pids.len() == count {
                    break pids;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    // Replica one holds the lock; the batch, then replica two, queue for it.
    let mut one = pool.acquire().await.unwrap();
    sqlx::raw_sql(lock).execute(&mut *one).await.unwrap();
    let batch = tokio::spawn({
        let store = store.store.clone();
        async move {
            store
                .append_batch_ahead(&[issuance("alice", "t1")], None, || true)
                .await
        }
    });
    waiters(1).await;
    let two = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut two = pool.acquire().await.unwrap();
            sqlx::raw_sql(lock).execute(&mut *two).await.unwrap();
            two
        }
    });
    waiters(2).await;
    // The batch commits; the lock ahead it asks for queues behind two.
    sqlx::raw_sql("COMMIT").execute(&mut *one).await.unwrap();
    let (written, ahead) = batch.await.unwrap();
    written.unwrap();
    assert!(ahead.is_some());
    let mut two = two.await.unwrap();
    let ahead_pid = waiters(1).await[0];
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(ahead_pid)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(terminated);
    sqlx::raw_sql("COMMIT").execute(&mut *two).await.unwrap();
    let (written, _) = store
        .store
        .append_batch_ahead(&[issuance("bob", "t2")], ahead, || false)
        .await;
    let appended = written.expect("the batch began afresh");
    assert_eq!(kind(&appended[0]), "recorded");
    assert_eq!(appended[0].stored().seq, 2);
    drop((one, two));
    store.finish().await;
}

/// The read-back of an unacknowledged commit (`holds`) given up while it
/// waits for the chain lock (the writer's deadline) leaves no connection
/// behind that would be granted the lock and then sit idle in the pool
/// holding it, stalling every replica.
#[tokio::test]
async fn a_read_back_given_up_while_waiting_for_the_lock_leaves_the_lock_free() {
    let store = Store::open(Backend::Postgres).await;
    let appended = store
        .store
        .append_batch(&[issuance("alice", "t1")])
        .await
        .unwrap();
    // Another replica's transaction holds the lock meanwhile.
    let mut other = postgres_pool(&store).acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT pg_advisory_xact_lock(8386103207072584527)")
        .execute(&mut *other)
        .await
        .unwrap();
    let given_up = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        store.store.holds(appended[0].stored()),
    )
    .await;
    assert!(given_up.is_err(), "the read-back did not wait for the lock");
    sqlx::raw_sql("COMMIT").execute(&mut *other).await.unwrap();
    drop(other);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    another_replica_appends_at_once(&store, 2).await;
    store.finish().await;
}

/// Alice's issuance, the trail's first record, committed with the next
/// batch's lock asked for ahead: the lock ahead, granted once it commits.
async fn first_batch_with_a_lock_ahead(store: &Store) -> LockAhead {
    let (written, ahead) = store
        .store
        .append_batch_ahead(&[issuance("alice", "t1")], None, || true)
        .await;
    written.unwrap();
    ahead.expect("a lock taken ahead")
}

/// A lock taken ahead that no batch takes (the writer stopped, or the batch
/// before it failed) frees the chain's lock when dropped: its connection
/// is closed, not handed back to the pool inside an open transaction
/// holding the lock, where every other replica would wait for it.
#[tokio::test]
async fn a_lock_ahead_dropped_untaken_frees_the_chain_lock() {
    let store = Store::open(Backend::Postgres).await;
    let ahead = first_batch_with_a_lock_ahead(&store).await;
    // Long enough for the lock to be granted to the transaction ahead.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(ahead);
    another_replica_appends_at_once(&store, 2).await;
    store.finish().await;
}

/// A chain transaction left idle (here a lock taken ahead that nobody
/// takes or drops, as a server cut off from the database by a partition
/// would leave it) is ended by Postgres after its idle limit (15 s), which
/// frees the chain's lock: the other replicas' batches time out meanwhile,
/// then commit, rather than waiting for TCP keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_chain_transaction_is_ended_and_its_lock_freed() {
    let store = Store::open(Backend::Postgres).await;
    let ahead = first_batch_with_a_lock_ahead(&store).await;
    // The lock ahead is asked for by a task of its own: wait until it holds it.
    let held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let granted = async {
        while sqlx::query_scalar::<_, i64>(held)
            .fetch_one(postgres_pool(&store))
            .await
            .unwrap()
            == 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), granted)
        .await
        .expect("the lock ahead was granted");
    let replica = replica_of(&store).await;
    let started = std::time::Instant::now();
    let mut refused = 0;
    let appended = loop {
        match replica.append_batch(&[issuance("bob", "t2")]).await {
            Ok(appended) => break appended,
            Err(StoreError::Unavailable(_)) if started.elapsed() < std::time::Duration::from_secs(40) => {
                refused += 1;
            }
            Err(error) => panic!("after {:?}: {error}", started.elapsed()),
        }
    };
    assert!(refused > 0, "the lock was held while the transaction was idle");
    assert_eq!(appended[0].stored().seq, 2);
    drop(ahead);
    replica.close().await;
    store.finish().await;
}

/// A batch that fails takes no lock ahead: what follows a failure (the
/// record-by-record retries, the read-back of an unacknowledged commit)
/// needs the chain lock itself, and would wait behind it. The batch here
/// fails at its `COMMIT` (a deferred constraint), after the lock ahead was
/// requested. And with no record waiting, none is taken either.
#[tokio::test]
async fn no_lock_is_taken_ahead_after_a_failed_batch_or_with_nothing_waiting() {
    let store = Store::open(Backend::Postgres).await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_mallory() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.username = 'mallory' THEN RAISE EXCEPTION 'refused at commit' USING ERRCODE = '23514'; END IF; \
           RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER refuse_mallory_at_commit AFTER INSERT ON audit_events \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_mallory()",
    )
    .execute(postgres_pool(&store))
    .await
    .unwrap();
    let asked = std::sync::atomic::AtomicBool::new(false);
    let (written, ahead) = store
        .store
        .append_batch_ahead(&[issuance("mallory", "t1")], None, || {
            asked.store(true, Ordering::Relaxed);
            true
        })
        .await;
    assert!(matches!(written, Err(StoreError::Refused(_))), "{written:?}");
    assert!(
        asked.load(Ordering::Relaxed),
        "the batch failed before its commit"
    );
    assert!(
        ahead.is_none(),
        "a failed batch handed over the next batch's lock"
    );
    // The retry, on another connection, is not held up behind it.
    let appended = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        store.store.append_batch(&[issuance("alice", "t2")]),
    )
    .await
    .expect("the chain lock is free")
    .unwrap();
    assert_eq!(kind(&appended[0]), "recorded");
    let (written, ahead) = store
        .store
        .append_batch_ahead(&[issuance("bob", "t3")], None, || false)
        .await;
    written.unwrap();
    assert!(ahead.is_none(), "nothing waited, and a lock was taken ahead");
    store.finish().await;
}

/// Through the writer, with requests arriving all the time: on Postgres the
/// batches run in locks taken ahead, on SQLite never; every request is
/// answered with its own record and the chain holds them all, in order.
async fn a_busy_writer_answers_every_request_on_one_chain(backend: Backend) {
    let store = Store::open(backend).await;
    let (writer, task) = AuditWriter::start(store.store.clone(), Box::new(|_, _| {}));
    let stats = writer.stats().clone();
    // More clients than one batch takes: records are always waiting.
    let clients: Vec<_> = (0..MAX_BATCH + 44)
        .map(|client| {
            let writer = writer.clone();
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..4 {
                    let appended = writer
                        .append(issuance(&format!("user{client}"), &format!("c{client}-{i}")))
                        .await
                        .unwrap();
                    assert_eq!(kind(&appended), "recorded");
                    seqs.push(appended.stored().seq);
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for client in clients {
        seqs.extend(client.await.unwrap());
    }
    seqs.sort_unstable();
    let requests = (MAX_BATCH + 44) as i64 * 4;
    assert_eq!(seqs, (1..=requests).collect::<Vec<i64>>(), "{backend:?}");
    let batches = stats.batches.load(Ordering::Relaxed);
    let ahead = stats.locked_ahead.load(Ordering::Relaxed);
    assert!(
        (batches as i64) < requests,
        "{backend:?}: {batches} batches, no group commit"
    );
    match backend {
        Backend::Postgres => assert!(ahead > 0, "{batches} batches, none in a lock taken ahead"),
        Backend::Sqlite => assert_eq!(ahead, 0),
    }
    drop(writer);
    task.await.unwrap();
    store.finish().await;
}

/// The writer has a thread, a runtime and database connections of its own:
/// it commits while the runtime its requests come from is busy, here
/// blocked outright (this test's only thread waits for the answer, which
/// comes through a thread of its own). A writer task on that runtime, or
/// one whose sockets that runtime watches, would never answer.
async fn the_writer_commits_while_the_requests_runtime_is_blocked(backend: Backend) {
    let store = Store::open(backend).await;
    let (writer, task) = AuditWriter::start(store.store.clone(), Box::new(|_, _| {}));
    let client = writer.clone();
    let (answer, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let appended = runtime.block_on(client.append(issuance("alice", "t1")));
        let _ = answer.send(appended.map(|a| a.stored().seq));
    });
    let seq = answered
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("no answer while this runtime was blocked");
    assert_eq!(seq.unwrap(), 1, "{backend:?}");
    drop(writer);
    task.await.unwrap();
    store.finish().await;
}

/// The writer's connections are not pinged before each batch (a round trip
/// per batch at low load); one that died while idle is found out by the
/// batch's `BEGIN` and replaced. Here both of the writer's connections
/// are ended by Postgres between batches, as a restart or an
/// `idle_session_timeout` would, and the next requests are answered all
/// the same: none is refused for a connection that was already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writers_connections_ended_while_idle_are_replaced_unnoticed() {
    let store = Store::open(Backend::Postgres).await;
    let pool = postgres_pool(&store).clone();
    let (writer, task) = AuditWriter::start(store.store.clone(), Box::new(|_, _| {}));
    // Both of the writer's connections open: batches in a lock taken ahead.
    let clients: Vec<_> = (0..MAX_BATCH + 8)
        .map(|client| {
            let writer = writer.clone();
            tokio::spawn(async move {
                writer
                    .append(issuance(&format!("user{client}"), &format!("a{client}")))
                    .await
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap().unwrap();
    }
    assert!(
        writer.stats().locked_ahead.load(Ordering::Relaxed) > 0,
        "a batch began in a lock taken ahead, on the writer's second connection"
    );
    // Client connections only: autovacuum may be at work on the table.
    let others = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                  AND backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let mut ours = pool.acquire().await.unwrap();
    let idle: Vec<i32> = sqlx::query_scalar(others).fetch_all(&mut *ours).await.unwrap();
    assert!(
        idle.len() >= 2,
        "the writer's two connections and the store's: {idle:?}"
    );
    for pid in &idle {
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
            .bind(pid)
            .fetch_one(&mut *ours)
            .await
            .unwrap();
        assert!(ended, "backend {pid}");
    }
    let left: Vec<i32> = sqlx::query_scalar(others).fetch_all(&mut *ours).await.unwrap();
    assert!(left.is_empty(), "still there: {left:?}");
    drop(ours);
    for i in 0..3 {
        let appended = writer
            .append(issuance("bob", &format!("b{i}")))
            .await
            .expect("answered on a connection of its own");
        assert_eq!(kind(&appended), "recorded");
        assert_eq!(appended.stored().seq, (MAX_BATCH + 9 + i) as i64);
    }
    drop(writer);
    task.await.unwrap();
    store.finish().await;
}

/// What [`sqlx_core::net::connect_tcp`] hands over: whether the TCP socket
/// it opened has Nagle's algorithm off.
struct NoDelay;

impl sqlx_core::net::WithSocket for NoDelay {
    type Output = Option<bool>;

    fn with_socket<S: sqlx_core::net::Socket>(self, socket: S) -> impl Future<Output = Option<bool>> + Send {
        let any: &dyn std::any::Any = &socket;
        let nodelay = any
            .downcast_ref::<tokio::net::TcpStream>()
            .map(|tcp| tcp.nodelay().unwrap());
        async move { nodelay }
    }
}

/// The connections Postgres connections are made of (`PgConnection`
/// connects through `connect_tcp`) send a batch's message in one go:
/// with Nagle's algorithm on, a message of more than one TLS record waits
/// for a delayed ACK (40 ms on loopback) before its end is sent.
#[tokio::test]
async fn postgres_connections_do_not_wait_for_acknowledgements() {
    let url = url::Url::parse(&talos_sso_tests::harness::admin_database_url()).unwrap();
    let (host, port) = (url.host_str().unwrap(), url.port().unwrap_or(5432));
    let nodelay = sqlx_core::net::connect_tcp(sqlx_core::net::SocketHost::Str(host), port, NoDelay)
        .await
        .unwrap();
    assert_eq!(nodelay, Some(true), "TCP_NODELAY on the socket to {host}:{port}");
}
