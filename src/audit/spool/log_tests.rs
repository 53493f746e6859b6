//! Tests of the spool: group-committed appends read back in order, batches and
//! cursor, rotation and deletion, full and closed spools, the lock, torn tails,
//! corruption, permissions.

use std::path::Path;

use super::*;
use std::os::unix::fs::FileExt;

fn settings(dir: &Path) -> SpoolSettings {
    SpoolSettings {
        dir: dir.to_owned(),
        segment_bytes: 1 << 20,
        fsync_interval: Duration::from_millis(10),
        max_bytes: 1 << 30,
        min_free_bytes: 0,
        write_timeout: Duration::from_secs(5),
        // A failed disk is tried again at once: the tests say when.
        reprobe_after: Duration::ZERO,
    }
}

/// A fake row: 28 bytes with `time_ms` at its offset, then a label.
fn payload(i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 28];
    v[20..28].copy_from_slice(&i.to_le_bytes());
    v.extend_from_slice(format!("row-{i}").as_bytes());
    v
}

async fn append(shared: &Shared, p: &[u8]) -> Result<(), SpoolError> {
    shared
        .append(|b| b.extend_from_slice(p))?
        .outcome()
        .await
        .unwrap()
}

fn stop(spool: Spool) -> SpoolReader {
    spool.shared.close();
    spool.syncer.join().unwrap();
    spool.reader
}

fn read_all(reader: &mut SpoolReader) -> Batch {
    let mut batch = Batch::default();
    reader.fill(&mut batch, usize::MAX, usize::MAX).unwrap();
    batch
}

fn concat(range: std::ops::Range<u64>) -> Vec<u8> {
    range.flat_map(payload).collect()
}

fn rejected_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir.join("rejected"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_from_concurrent_callers_are_all_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    let shared = Arc::clone(&spool.shared);
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let s = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move { append(&s, &payload(i)).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let mut reader = stop(spool);
    let batch = read_all(&mut reader);
    assert_eq!(batch.rows, 200);
    assert_eq!(labels(&batch), (0..200).collect::<Vec<_>>());
}

fn payload_time_ms(p: &[u8]) -> u64 {
    crate::audit::record::payload_time_ms(p).unwrap()
}

#[tokio::test]
async fn batch_tracks_its_first_row_and_end_position() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..10 {
        append(&spool.shared, &payload(1000 + i)).await.unwrap();
    }
    let mut reader = stop(spool);
    let mut batch = Batch::default();
    assert_eq!(
        reader.fill(&mut batch, 4, usize::MAX).unwrap(),
        FillOutcome::Full
    );
    assert_eq!(batch.rows, 4);
    assert_eq!(batch.first_time_ms, Some(1000));
    assert_eq!(batch.body, concat(1000..1004));
    let first_len = (RECORD_HEADER_LEN + payload(1000).len()) as u64;
    assert_eq!(batch.start.unwrap().offset, SEGMENT_HEADER_LEN);
    assert_eq!(
        batch.end.unwrap().offset,
        SEGMENT_HEADER_LEN + 4 * first_len
    );
    batch.reset();
    assert_eq!(
        reader.fill(&mut batch, 100, usize::MAX).unwrap(),
        FillOutcome::CaughtUp
    );
    assert_eq!(batch.body, concat(1004..1010));
}

#[tokio::test]
async fn restart_resumes_after_the_acknowledged_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..10 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    let mut reader = stop(spool);
    let mut batch = Batch::default();
    reader.fill(&mut batch, 6, usize::MAX).unwrap();
    write_cursor(dir.path(), batch.end.unwrap()).unwrap();
    drop(reader);

    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert_eq!(spool.recovery.segments, 1);
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, concat(6..10));
}

#[tokio::test]
async fn rotation_spreads_rows_over_segments_and_finished_ones_are_deletable() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.segment_bytes = 4096;
    let spool = open(&s, Metrics::default()).unwrap();
    for i in 0..300 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    let shared = Arc::clone(&spool.shared);
    let mut reader = stop(spool);
    let segs = list_segments(dir.path()).unwrap();
    assert!(segs.len() > 3, "{segs:?}");
    let on_disk: u64 = segs
        .iter()
        .map(|&s| fs::metadata(segment_path(dir.path(), s)).unwrap().len())
        .sum();
    assert_eq!(shared.bytes_on_disk.load(Ordering::Relaxed), on_disk);

    let batch = read_all(&mut reader);
    assert_eq!(batch.body, concat(0..300));
    // Every segment but the active (last) one was read to its end.
    assert_eq!(batch.finished_segments, segs[..segs.len() - 1]);
    delete_segments(&shared, &batch.finished_segments);
    assert_eq!(list_segments(dir.path()).unwrap(), segs[segs.len() - 1..]);
    let last_len = fs::metadata(segment_path(dir.path(), segs[segs.len() - 1]))
        .unwrap()
        .len();
    assert_eq!(shared.bytes_on_disk.load(Ordering::Relaxed), last_len);
}

#[tokio::test]
async fn rows_beyond_max_bytes_are_refused_as_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.max_bytes = 1000;
    let spool = open(&s, Metrics::default()).unwrap();
    let mut ok = 0;
    let err = loop {
        match append(&spool.shared, &payload(ok)).await {
            Ok(()) => ok += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SpoolError::Full { max: 1000, .. }), "{err}");
    // 16-byte header, 8 + 33..35 bytes per row.
    assert!((20..=24).contains(&ok), "{ok}");
    stop(spool);
}

/// Reads every row of `batch` back as its `time_ms` label, sorted.
fn labels(batch: &Batch) -> Vec<u64> {
    let mut got: Vec<u64> = Vec::new();
    let mut rest = &batch.body[..];
    while !rest.is_empty() {
        let (row, tail) = rest.split_at(28 + format!("row-{}", payload_time_ms(rest)).len());
        got.push(payload_time_ms(row));
        rest = tail;
    }
    got.sort_unstable();
    got
}

#[test]
fn threads_racing_for_the_leader_role_lose_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments: leaders rotate while others queue behind them.
    let spool = open(
        &SpoolSettings {
            segment_bytes: 4 << 10,
            ..settings(dir.path())
        },
        Metrics::default(),
    )
    .unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let s = Arc::clone(&spool.shared);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let mut led = 0;
                for i in 0..500u64 {
                    let p = payload(t * 1000 + i);
                    match s.append(|b| b.extend_from_slice(&p)).unwrap() {
                        Appended::Written(r) => {
                            r.unwrap();
                            led += 1;
                        }
                        queued => rt.block_on(queued.outcome()).unwrap().unwrap(),
                    }
                }
                led
            })
        })
        .collect();
    let led: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(led > 0, "some appends must have led their own group");
    let mut reader = stop(spool);
    let mut all = Vec::new();
    loop {
        let batch = read_all(&mut reader);
        if batch.rows == 0 {
            break;
        }
        all.extend(labels(&batch));
    }
    all.sort_unstable();
    let want: Vec<u64> = (0..8u64)
        .flat_map(|t| (0..500u64).map(move |i| t * 1000 + i))
        .collect();
    assert_eq!(all, want);
}

/// Pretends a leader is mid-write, so the rows labelled `labels` queue behind it.
fn queue_behind_a_leader(shared: &Shared, labels: std::ops::Range<u64>) -> Vec<Appended> {
    shared.queue().writing = true;
    labels
        .map(|i| shared.append(|b| b.extend_from_slice(&payload(i))).unwrap())
        .collect()
}

#[tokio::test]
async fn a_handed_off_queue_is_written_and_acknowledged_by_the_spool_thread() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    let shared = Arc::clone(&spool.shared);
    let queued = queue_behind_a_leader(&shared, 0..5);
    assert!(queued.iter().all(|a| matches!(a, Appended::Queued(_))));
    // The leader used up its rounds and hands over.
    shared.queue().handed_off = true;
    shared.wake_syncer.notify_one();
    for a in queued {
        a.outcome().await.unwrap().unwrap();
    }
    // Waiters are answered before the thread finds the queue empty and
    // clears `writing`: give it that moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while shared.queue().writing && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(
        !shared.queue().writing,
        "the spool thread ends the hand-off"
    );
    // The next row is led by its caller again.
    assert!(matches!(
        shared.append(|b| b.extend_from_slice(&payload(5))).unwrap(),
        Appended::Written(Ok(()))
    ));
    let mut reader = stop(spool);
    assert_eq!(labels(&read_all(&mut reader)), (0..6).collect::<Vec<_>>());
}

#[tokio::test]
async fn rows_queued_when_the_spool_closes_are_still_written() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    let shared = Arc::clone(&spool.shared);
    let queued = queue_behind_a_leader(&shared, 0..3);
    shared.queue().handed_off = true;
    let mut reader = stop(spool);
    for a in queued {
        a.outcome().await.unwrap().unwrap();
    }
    assert_eq!(labels(&read_all(&mut reader)), vec![0, 1, 2]);
}

#[tokio::test]
async fn the_spool_thread_syncs_written_rows_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    append(&spool.shared, &payload(1)).await.unwrap();
    assert!(spool.shared.log().dirty, "written, not yet synced");
    // settings(): fsync every 10 ms.
    let deadline = Instant::now() + Duration::from_secs(5);
    while spool.shared.log().dirty {
        assert!(Instant::now() < deadline, "never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop(spool);
}

#[tokio::test]
async fn appends_after_close_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    let shared = Arc::clone(&spool.shared);
    stop(spool);
    assert!(matches!(
        append(&shared, &payload(1)).await,
        Err(SpoolError::Closed)
    ));
}

#[test]
fn a_second_process_cannot_open_a_locked_spool() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert!(matches!(
        open(&settings(dir.path()), Metrics::default()),
        Err(SpoolError::Locked { .. })
    ));
    stop(spool);
}

#[tokio::test]
async fn torn_tail_is_cut_at_open_and_kept_in_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..3 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    drop(stop(spool));
    let seg = segment_path(dir.path(), 1);
    let good_len = fs::metadata(&seg).unwrap().len();
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[50, 0, 0, 0, 1, 2]).unwrap(); // half a record header
    drop(f);

    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert_eq!(spool.recovery.cut_bytes, 6);
    assert_eq!(fs::metadata(&seg).unwrap().len(), good_len);
    let rejected = rejected_files(dir.path());
    assert_eq!(rejected.len(), 1);
    assert_eq!(fs::read(&rejected[0]).unwrap(), [50, 0, 0, 0, 1, 2]);
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, concat(0..3));
}

#[tokio::test]
async fn corrupt_record_found_while_reading_is_moved_aside_and_reading_continues() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..3 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    // Bit rot in the second record's payload, after it was written.
    let seg = segment_path(dir.path(), 1);
    let rec = (RECORD_HEADER_LEN + payload(0).len()) as u64;
    let f = OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(b"X", SEGMENT_HEADER_LEN + rec + 8 + 25)
        .unwrap();
    drop(f);
    let mut reader = spool.reader;
    let mut batch = Batch::default();
    reader.fill(&mut batch, usize::MAX, usize::MAX).unwrap();
    // Row 0 is read; from the bad record up to the committed length (a record
    // boundary) the bytes move to rejected/, good row 2 included.
    assert_eq!(batch.body, payload(0));
    for i in 3..5 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    reader.fill(&mut batch, usize::MAX, usize::MAX).unwrap();
    assert_eq!(batch.body, [payload(0), payload(3), payload(4)].concat());
    let rejected = rejected_files(dir.path());
    assert_eq!(rejected.len(), 1);
    assert_eq!(fs::read(&rejected[0]).unwrap().len() as u64, 2 * rec);
    spool.shared.close();
    spool.syncer.join().unwrap();
}

#[test]
fn cursor_round_trips_and_a_damaged_cursor_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_cursor(dir.path()), None);
    let pos = Position {
        seq: 7,
        offset: 12_345,
    };
    write_cursor(dir.path(), pos).unwrap();
    assert_eq!(read_cursor(dir.path()), Some(pos));
    let mut bytes = fs::read(dir.path().join("cursor")).unwrap();
    bytes[3] ^= 1;
    fs::write(dir.path().join("cursor"), bytes).unwrap();
    assert_eq!(read_cursor(dir.path()), None);
}

#[test]
fn valid_prefix_stops_at_the_first_bad_record() {
    let mut seg = Vec::new();
    seg.extend_from_slice(MAGIC);
    seg.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    seg.extend_from_slice(&[0; 4]);
    for p in [b"abc".as_slice(), b"defg"] {
        seg.extend_from_slice(&(p.len() as u32).to_le_bytes());
        seg.extend_from_slice(&crc32fast::hash(p).to_le_bytes());
        seg.extend_from_slice(p);
    }
    let good = seg.len();
    assert_eq!(valid_prefix(&seg), good);
    seg.extend_from_slice(&3u32.to_le_bytes());
    seg.extend_from_slice(&0u32.to_le_bytes()); // wrong crc
    seg.extend_from_slice(b"xyz");
    assert_eq!(valid_prefix(&seg), good);
    assert_eq!(valid_prefix(&seg[..good - 1]), good - 4 - 8);
    assert_eq!(valid_prefix(b"NOTMAGIC\x01\0\0\0\0\0\0\0"), 0);
    // An absurd length is corruption, not a reason to wait for 4 GB.
    let mut huge = seg[..good].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[0; 4]);
    assert_eq!(valid_prefix(&huge), good);
}

/// A segment of format `version` holding `rows`, as the release that
/// wrote that format left it.
fn segment_of(version: u32, rows: &[Vec<u8>]) -> Vec<u8> {
    let mut seg = Vec::new();
    seg.extend_from_slice(MAGIC);
    seg.extend_from_slice(&version.to_le_bytes());
    seg.extend_from_slice(&[0; 4]);
    for p in rows {
        seg.extend_from_slice(&(p.len() as u32).to_le_bytes());
        seg.extend_from_slice(&crc32fast::hash(p).to_le_bytes());
        seg.extend_from_slice(p);
    }
    seg
}

#[tokio::test]
async fn rows_of_older_formats_are_read_completed_with_the_columns_added_since() {
    use crate::audit::record::{
        APPROVAL_TAIL, LEGACY_TAIL, SCREENING_TAIL, SHADOW_TAIL, VIRTUAL_TAIL,
    };
    let dir = tempfile::tempdir().unwrap();
    // Left by earlier releases (formats 1 to 5) and by this one (6).
    let formats: [(u32, &[u8]); 6] = [
        (LEGACY_VERSION, &LEGACY_TAIL),
        (SCREENING_VERSION, &SCREENING_TAIL),
        (VIRTUAL_VERSION, &VIRTUAL_TAIL),
        (super::format::APPROVAL_VERSION, &APPROVAL_TAIL),
        (super::format::SHADOW_VERSION, &SHADOW_TAIL),
        (FORMAT_VERSION, &[]),
    ];
    assert_eq!(FORMAT_VERSION, 6);
    let mut want = Vec::new();
    for (seq, (version, tail)) in (1u64..).zip(formats) {
        let rows: Vec<Vec<u8>> = (0..2).map(|i| payload(seq * 10 + i)).collect();
        fs::write(segment_path(dir.path(), seq), segment_of(version, &rows)).unwrap();
        for r in rows {
            want.extend_from_slice(&r);
            want.extend_from_slice(tail);
        }
    }
    // A new row goes into a new segment of this build's format.
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert_eq!(spool.recovery.segments, 6);
    append(&spool.shared, &payload(50)).await.unwrap();
    want.extend_from_slice(&payload(50));
    let mut reader = stop(spool);
    let batch = read_all(&mut reader);
    assert_eq!(batch.rows, 13);
    assert_eq!(
        batch.body, want,
        "each old row completed by its format's tail"
    );
    let newest = fs::read(segment_path(dir.path(), 7)).unwrap();
    assert_eq!(header_version(&newest), Some(FORMAT_VERSION));
}

#[tokio::test]
async fn segments_before_the_cursor_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.segment_bytes = 4096;
    let spool = open(&s, Metrics::default()).unwrap();
    for i in 0..200 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    drop(stop(spool));
    let segs = list_segments(dir.path()).unwrap();
    write_cursor(
        dir.path(),
        Position {
            seq: segs[2],
            offset: SEGMENT_HEADER_LEN,
        },
    )
    .unwrap();
    let spool = open(&s, Metrics::default()).unwrap();
    let now = list_segments(dir.path()).unwrap();
    assert_eq!(now[0], segs[2]);
    stop(spool);
}

#[tokio::test]
async fn numbering_continues_past_the_cursor_when_every_segment_was_shipped() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..3 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    let mut reader = stop(spool);
    let batch = read_all(&mut reader);
    write_cursor(dir.path(), batch.end.unwrap()).unwrap();
    drop(reader);
    for seq in list_segments(dir.path()).unwrap() {
        fs::remove_file(segment_path(dir.path(), seq)).unwrap();
    }

    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert_eq!(list_segments(dir.path()).unwrap(), [2]);
    append(&spool.shared, &payload(9)).await.unwrap();
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, payload(9));
}

#[tokio::test]
async fn a_segment_without_a_valid_header_is_set_aside_at_open() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(segment_path(dir.path(), 4), b"MCPF").unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    assert_eq!(spool.recovery.segments, 0);
    assert_eq!(spool.recovery.cut_bytes, 4);
    assert_eq!(rejected_files(dir.path()).len(), 1);
    append(&spool.shared, &payload(1)).await.unwrap();
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, payload(1));
    assert_eq!(list_segments(dir.path()).unwrap(), [5]);
}

#[tokio::test]
async fn spool_files_are_private_to_the_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("spool");
    let spool = open(&settings(&root), Metrics::default()).unwrap();
    append(&spool.shared, &payload(1)).await.unwrap();
    let mut reader = stop(spool);
    write_cursor(&root, read_all(&mut reader).end.unwrap()).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join("rejected")), 0o700);
    assert_eq!(mode(&segment_path(&root, 1)), 0o600);
    assert_eq!(mode(&root.join("cursor")), 0o600);
    assert_eq!(mode(&root.join("LOCK")), 0o600);
}

// --- disk faults ----------------------------------------------------------

use super::super::super::fault::{self, Plan};

const FULL: Plan = Plan {
    no_space: true,
    stall: None,
};

#[tokio::test]
async fn a_full_disk_seals_the_segment_so_shipped_rows_still_free_it() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..10 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    let first = list_segments(dir.path()).unwrap();
    fault::inject(dir.path(), FULL);
    let err = append(&spool.shared, &payload(10)).await.unwrap_err();
    assert!(matches!(err, SpoolError::Write { .. }), "{err}");
    // Writes keep failing; no segment can be created.
    assert!(append(&spool.shared, &payload(11)).await.is_err());
    // The failed segment is sealed: the shipper reads it to its end and may
    // delete it once shipped, freeing the disk.
    let shared = Arc::clone(&spool.shared);
    let mut reader = spool.reader;
    let batch = read_all(&mut reader);
    assert_eq!(batch.body, concat(0..10));
    assert_eq!(batch.finished_segments, first);
    delete_segments(&shared, &batch.finished_segments);
    assert!(list_segments(dir.path()).unwrap().is_empty());
    assert_eq!(shared.bytes_on_disk.load(Ordering::Relaxed), 0);
    // Space is back: a new segment takes the next rows, and they read back.
    fault::clear(dir.path());
    append(&shared, &payload(12)).await.unwrap();
    let batch = read_all(&mut reader);
    assert_eq!(batch.body, concat(12..13));
    shared.close();
    spool.syncer.join().unwrap();
}

#[tokio::test]
async fn start_up_on_a_full_disk_succeeds_and_what_was_spooled_still_ships() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    for i in 0..5 {
        append(&spool.shared, &payload(i)).await.unwrap();
    }
    drop(stop(spool));
    fault::inject(dir.path(), FULL);
    let spool = open(&settings(dir.path()), Metrics::default()).expect("starts on a full disk");
    assert!(append(&spool.shared, &payload(5)).await.is_err());
    let shared = Arc::clone(&spool.shared);
    let mut reader = spool.reader;
    let batch = read_all(&mut reader);
    assert_eq!(
        batch.body,
        concat(0..5),
        "the rows left by the last run ship"
    );
    // The cursor cannot be written on the full disk; the old one stays valid.
    write_cursor(dir.path(), Position { seq: 1, offset: 16 }).unwrap_err();
    fault::clear(dir.path());
    append(&shared, &payload(6)).await.unwrap();
    assert_eq!(read_all(&mut reader).body, concat(6..7));
    shared.close();
    spool.syncer.join().unwrap();
}

#[test]
fn the_cursor_is_rewritten_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let a = Position {
        seq: 3,
        offset: 1000,
    };
    let b = Position { seq: 4, offset: 16 };
    write_cursor(dir.path(), a).unwrap();
    write_cursor(dir.path(), b).unwrap();
    assert_eq!(read_cursor(dir.path()), Some(b));
    assert_eq!(fs::metadata(dir.path().join("cursor")).unwrap().len(), 20);
    assert!(!dir.path().join("cursor.tmp").exists());
}

#[test]
fn a_stalled_write_refuses_new_rows_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.write_timeout = Duration::from_millis(100);
    let spool = open(&s, Metrics::default()).unwrap();
    fault::inject(
        dir.path(),
        Plan {
            no_space: false,
            stall: Some(Duration::from_millis(800)),
        },
    );
    let shared = Arc::clone(&spool.shared);
    let leader = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(append(&shared, &payload(1)))
    });
    // The leader's write stalls past the 100 ms deadline.
    let deadline = Instant::now() + Duration::from_secs(5);
    while spool.shared.accepting() {
        assert!(Instant::now() < deadline, "a stalled spool says so");
        std::thread::yield_now();
    }
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let err = rt.block_on(append(&spool.shared, &payload(2))).unwrap_err();
    assert!(matches!(err, SpoolError::Stalled { ms: 100 }), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "refused at once"
    );
    fault::clear(dir.path());
    leader.join().unwrap().unwrap();
    assert!(spool.shared.accepting());
    stop(spool);
}

#[tokio::test]
async fn too_little_free_space_refuses_rows_like_a_full_spool() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.min_free_bytes = u64::MAX;
    let spool = open(&s, Metrics::default()).unwrap();
    let err = append(&spool.shared, &payload(1)).await.unwrap_err();
    assert!(
        matches!(err, SpoolError::LowSpace { min: u64::MAX, .. }),
        "{err}"
    );
    assert!(!spool.shared.accepting());
    stop(spool);
}

#[test]
fn after_a_slow_write_callers_hand_their_rows_to_the_spool_thread() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    // A serving thread (single-threaded runtime): it writes its own row.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let own = spool
        .shared
        .append(|b| b.extend_from_slice(&payload(1)))
        .unwrap();
    assert!(matches!(own, Appended::Written(Ok(()))));
    // A slow disk: the leader's write takes 60 ms (over SLOW_WRITE).
    fault::inject(
        dir.path(),
        Plan {
            no_space: false,
            stall: Some(Duration::from_millis(60)),
        },
    );
    let slow = spool
        .shared
        .append(|b| b.extend_from_slice(&payload(2)))
        .unwrap();
    assert!(matches!(slow, Appended::Written(Ok(()))));
    assert!(spool.shared.disk_slow());
    // Now the spool thread writes: the caller queues and waits, and is not
    // the one whose thread a slow write holds.
    let queued = spool
        .shared
        .append(|b| b.extend_from_slice(&payload(3)))
        .unwrap();
    assert!(matches!(queued, Appended::Queued(_)), "handed off");
    rt.block_on(async { queued.outcome().await.unwrap().unwrap() });
    fault::clear(dir.path());
    // Past SLOW_FOR without a slow write, callers write again.
    std::thread::sleep(SLOW_FOR + Duration::from_millis(50));
    assert!(!spool.shared.disk_slow());
    let own = spool
        .shared
        .append(|b| b.extend_from_slice(&payload(4)))
        .unwrap();
    assert!(matches!(own, Appended::Written(Ok(()))));
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, concat(1..5));
}

/// Appends one row from a thread of its own, as a serving thread does, and
/// says how the row was taken.
fn append_on_a_serving_thread(
    shared: &Arc<Shared>,
    label: u64,
) -> std::thread::JoinHandle<Appended> {
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _in = rt.enter();
        shared
            .append(|b| b.extend_from_slice(&payload(label)))
            .unwrap()
    })
}

#[test]
fn a_serving_thread_writes_its_own_row_after_another_threads_write() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    // Another thread is writing (it holds the segment) for a moment.
    let held = spool.shared.log();
    let caller = append_on_a_serving_thread(&spool.shared, 1);
    std::thread::sleep(Duration::from_millis(2));
    drop(held);
    // The caller waited and wrote its row itself: nothing was queued for
    // anyone to acknowledge, so no thread was woken for it.
    let took = caller.join().unwrap();
    assert!(matches!(took, Appended::Written(Ok(()))), "{took:?}");
    assert!(spool.shared.queue().waiters.is_empty());
    assert!(!spool.shared.disk_slow());
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, concat(1..2));
}

#[test]
fn a_serving_thread_held_longer_than_a_fast_write_hands_its_row_to_the_spool_thread() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(&settings(dir.path()), Metrics::default()).unwrap();
    let held = spool.shared.log();
    let caller = append_on_a_serving_thread(&spool.shared, 1);
    // Longer than SLOW_WRITE: the caller stops waiting, the disk counts as
    // slow, and the row is queued for the spool thread.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !spool.shared.disk_slow() {
        assert!(Instant::now() < deadline, "the wait is bounded");
        std::thread::sleep(Duration::from_millis(1));
    }
    let queued = caller.join().unwrap();
    assert!(matches!(queued, Appended::Queued(_)), "{queued:?}");
    drop(held);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async { queued.outcome().await.unwrap().unwrap() });
    let mut reader = stop(spool);
    assert_eq!(read_all(&mut reader).body, concat(1..2));
}

#[test]
fn the_chain_head_is_kept_beside_the_cursor_and_a_torn_one_reads_as_none() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_chain_head(dir.path()), None);
    let head = ChainHead {
        at: Position {
            seq: 3,
            offset: 4096,
        },
        writer_tag: [1, 2, 3, 4, 5, 6, 7, 8],
        seq: 77,
        hash: [9; 32],
        linked_from: 5,
    };
    write_chain_head(dir.path(), &head).unwrap();
    assert_eq!(read_chain_head(dir.path()), Some(head));
    // A release before links kept no `linked_from`: read as 0.
    let mut old = std::fs::read(dir.path().join("chain")).unwrap();
    old.truncate(64);
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.path().join("chain"), &old).unwrap();
    assert_eq!(
        read_chain_head(dir.path()),
        Some(ChainHead {
            linked_from: 0,
            ..head
        })
    );
    write_chain_head(dir.path(), &head).unwrap();
    // The cursor is its own file.
    write_cursor(
        dir.path(),
        Position {
            seq: 3,
            offset: 4096,
        },
    )
    .unwrap();
    assert_eq!(read_chain_head(dir.path()), Some(head));
    // A torn write (one byte changed) fails its crc.
    let path = dir.path().join("chain");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[30] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read_chain_head(dir.path()), None);
}
