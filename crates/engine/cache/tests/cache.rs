//! The cache against a model: what reads return, what a FLUSH or FUA makes
//! durable, what survives a crash in journal mode (replay), a journal that
//! fails under load, and a ring that wraps many times.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvraid_cache::journal::{self, format::Superblock, Journal, JournalDevice};
use nvraid_cache::{CacheMode, CacheOptions, CachedTarget};
use nvraid_io::queue::{OpKind, Queue, Target};
use nvraid_testing::MemTarget;

const KIB: usize = 1024;
const ARRAY_BYTES: u64 = 8 << 20;
const ARRAY_UUID: [u8; 16] = [0x42; 16];

/// A journal member in memory: what reads see and what survives a crash;
/// it can be made to fail every write.
#[derive(Clone)]
struct MemJournal {
    current: Arc<Mutex<Vec<u8>>>,
    durable: Arc<Mutex<Vec<u8>>>,
    broken: Arc<Mutex<bool>>,
}

impl MemJournal {
    fn new(bytes: usize) -> MemJournal {
        MemJournal {
            current: Arc::new(Mutex::new(vec![0; bytes])),
            durable: Arc::new(Mutex::new(vec![0; bytes])),
            broken: Arc::new(Mutex::new(false)),
        }
    }

    /// What a crash leaves: the durable image, as a new device.
    fn after_crash(&self) -> MemJournal {
        let durable = self.durable.lock().unwrap().clone();
        MemJournal {
            current: Arc::new(Mutex::new(durable.clone())),
            durable: Arc::new(Mutex::new(durable)),
            broken: Arc::new(Mutex::new(false)),
        }
    }
}

impl JournalDevice for MemJournal {
    fn name(&self) -> String {
        "mem-journal".into()
    }
    fn size_bytes(&self) -> u64 {
        self.current.lock().unwrap().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&self.current.lock().unwrap()[at..at + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if *self.broken.lock().unwrap() {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        let at = offset as usize;
        self.current.lock().unwrap()[at..at + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if *self.broken.lock().unwrap() {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        let current = self.current.lock().unwrap().clone();
        *self.durable.lock().unwrap() = current;
        Ok(())
    }
}

fn quiet() -> Arc<dyn Fn(&str) + Send + Sync> {
    Arc::new(|_: &str| {})
}

/// Opens a journal the way `serve` does: read the superblock (format a
/// new one when there is none), replay onto `array`, write the new tail.
fn open_journal(device: &MemJournal, array: &MemTarget) -> (Journal, journal::Replayed) {
    let superblock = match journal::read_superblock(device, &ARRAY_UUID).unwrap() {
        Some(sb) => sb,
        None => {
            let sb = journal::new_superblock(device.size_bytes(), ARRAY_UUID, [7; 16]);
            journal::write_superblock(device, &sb).unwrap();
            sb
        }
    };
    let mut queue = array.open_queue(1, 4 << 20).unwrap();
    let (replayed, after) = journal::replay(device, &superblock, &mut |offset, data| {
        queue.buffer_mut(0)[..data.len()].copy_from_slice(data);
        run(&mut *queue, OpKind::Write, offset, data.len() as u32, false)
            .map(drop)
            .map_err(io::Error::from_raw_os_error)
    })
    .unwrap();
    run(&mut *queue, OpKind::Flush, 0, 0, false).unwrap();
    journal::write_superblock(device, &after).unwrap();
    let journal = Journal::new(Box::new(device.clone()), after);
    (journal, replayed)
}

/// One request on slot 0, waited for.
fn run(queue: &mut dyn Queue, op: OpKind, offset: u64, len: u32, fua: bool) -> Result<u32, i32> {
    queue
        .submit(0, op, offset, len, fua)
        .map_err(|e| e.raw_os_error().unwrap())?;
    let mut result = None;
    while result.is_none() {
        queue.reap(1, &mut |c| result = Some(c.result)).unwrap();
    }
    result.unwrap()
}

fn write(queue: &mut dyn Queue, offset: u64, data: &[u8], fua: bool) -> Result<u32, i32> {
    queue.buffer_mut(0)[..data.len()].copy_from_slice(data);
    run(queue, OpKind::Write, offset, data.len() as u32, fua)
}

fn read(queue: &mut dyn Queue, offset: u64, len: usize) -> Vec<u8> {
    run(queue, OpKind::Read, offset, len as u32, false).unwrap();
    queue.buffer_mut(0)[..len].to_vec()
}

/// A deterministic pseudo-random sequence (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn block(&mut self, blocks: u64) -> u64 {
        self.next() % blocks
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..len).map(|_| rng.next() as u8).collect()
}

fn small_cache(mode: CacheMode, journal: Option<Journal>, array: &MemTarget) -> CachedTarget {
    let options = CacheOptions {
        dirty_max_bytes: 1 << 20,
        background_bytes: 256 * KIB as u64,
        expire: Duration::from_millis(200),
    };
    let journal = journal.map(|j| Box::new(j) as Box<dyn nvraid_cache::journal::JournalLog>);
    CachedTarget::new(Arc::new(array.clone()), mode, journal, options, quiet()).unwrap()
}

/// A journal-mode cache over `array` (1 MiB dirty at most, background
/// write-back above 256 KiB) writing back what waited `expire`.
fn journal_cache(
    array: &MemTarget,
    journal: Box<dyn nvraid_cache::journal::JournalLog>,
    expire: Duration,
) -> CachedTarget {
    let options = CacheOptions {
        dirty_max_bytes: 1 << 20,
        background_bytes: 256 * KIB as u64,
        expire,
    };
    CachedTarget::new(
        Arc::new(array.clone()),
        CacheMode::Journal,
        Some(journal),
        options,
        quiet(),
    )
    .unwrap()
}

/// Random writes of 4–64 KiB and reads over a model, in one mode; returns
/// the model.
fn random_load(queue: &mut dyn Queue, seed: u64, ops: usize) -> Vec<u8> {
    let mut model = vec![0u8; ARRAY_BYTES as usize];
    let mut rng = Rng(seed);
    let blocks = ARRAY_BYTES / 4096;
    for i in 0..ops {
        let count = 1 + rng.block(16);
        let first = rng.block(blocks - count);
        let (offset, len) = (first * 4096, (count * 4096) as usize);
        if rng.next().is_multiple_of(3) {
            let got = read(queue, offset, len);
            assert!(
                got == model[offset as usize..offset as usize + len],
                "op {i}: read at {offset} len {len} differs from the model"
            );
        } else {
            let data = pattern(rng.next(), len);
            write(queue, offset, &data, false).unwrap();
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
        }
    }
    model
}

#[test]
fn write_back_reads_what_was_written_and_flush_makes_it_durable() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let cache = small_cache(CacheMode::WriteBack, None, &array);
    assert_eq!(cache.sector_bytes(), 4096);
    let mut queue = cache.open_queue(4, 1 << 20).unwrap();
    let model = random_load(&mut *queue, 11, 3000);
    run(&mut *queue, OpKind::Flush, 0, 0, false).unwrap();
    assert!(
        array.durable_contents() == model,
        "a FLUSH left data only in RAM"
    );
    drop(queue);
    cache.close().unwrap();
    assert_eq!(cache.stats().dirty_bytes, 0);
}

#[test]
fn write_back_fua_write_is_durable_when_acknowledged() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let cache = CachedTarget::new(
        Arc::new(array.clone()),
        CacheMode::WriteBack,
        None,
        CacheOptions::default(),
        quiet(),
    )
    .unwrap();
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    write(&mut *queue, 4096, &[1u8; 8192], false).unwrap();
    let data = pattern(5, 4096);
    write(&mut *queue, 1 << 20, &data, true).unwrap();
    let durable = array.durable_contents();
    assert_eq!(&durable[1 << 20..(1 << 20) + 4096], &data[..]);
    // A FUA write is durable with everything acknowledged before it.
    assert!(durable[4096..12288].iter().all(|&b| b == 1));
}

#[test]
fn write_back_without_flush_loses_writes_on_a_crash() {
    // The mode's documented price, shown: nothing reached the array yet.
    let array = MemTarget::mem(ARRAY_BYTES);
    let cache = CachedTarget::new(
        Arc::new(array.clone()),
        CacheMode::WriteBack,
        None,
        CacheOptions {
            expire: Duration::from_secs(3600),
            ..CacheOptions::default()
        },
        quiet(),
    )
    .unwrap();
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    write(&mut *queue, 0, &[9u8; 4096], false).unwrap();
    assert_eq!(read(&mut *queue, 0, 4096), vec![9u8; 4096]);
    assert!(array.durable_contents()[..4096].iter().all(|&b| b == 0));
    assert_eq!(cache.stats().dirty_bytes, 4096);
}

#[test]
fn dirty_data_stays_within_its_bound() {
    let array = MemTarget::mem(ARRAY_BYTES).latency(Duration::from_micros(200));
    let cache = small_cache(CacheMode::WriteBack, None, &array);
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    for i in 0..64u64 {
        write(&mut *queue, i * 65536, &pattern(i, 65536), false).unwrap();
        assert!(cache.stats().dirty_bytes <= 1 << 20, "dirty past the bound");
    }
}

#[test]
fn journal_mode_keeps_every_acknowledged_write_through_a_crash() {
    for seed in [1u64, 2, 3] {
        let array = MemTarget::mem(ARRAY_BYTES);
        let device = MemJournal::new(16 << 20);
        let (journal, _) = open_journal(&device, &array);
        // No write-back by age (on a loaded machine it could put every page
        // on the array before the crash, leaving the journal nothing to
        // prove); the background write-back above a quarter stays.
        let cache = journal_cache(&array, Box::new(journal), Duration::from_secs(600));
        let mut queue = cache.open_queue(4, 1 << 20).unwrap();
        let model = random_load(&mut *queue, seed, 1500);
        // Power fails: only durable images remain; the cache is gone.
        array.crash();
        let journal_after = device.after_crash();
        std::mem::forget(queue);
        std::mem::forget(cache);
        // The array alone misses acknowledged writes: the journal has them.
        assert!(
            array.contents() != model,
            "seed {seed}: nothing left to replay"
        );
        let (_, replayed) = open_journal(&journal_after, &array);
        assert!(replayed.records > 0);
        assert!(
            array.contents() == model,
            "seed {seed}: an acknowledged write is missing after replay ({replayed:?})"
        );
    }
}

#[test]
fn journal_ring_wraps_many_times_and_replays_the_last_lap() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let device = MemJournal::new(16 << 20);
    let (journal, _) = open_journal(&device, &array);
    let cache = small_cache(CacheMode::Journal, Some(journal), &array);
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    let mut model = vec![0u8; ARRAY_BYTES as usize];
    // 80 MiB through a 16 MiB journal: five laps and more.
    for i in 0..80u64 {
        if i == 79 {
            // The last write's pages reach the array seconds after it is
            // acknowledged: at the crash they are in the journal only,
            // however the threads were scheduled meanwhile.
            array.update_faults(|f| f.latency = Duration::from_secs(3));
        }
        let offset = (i % 8) << 20;
        let data = pattern(i, 1 << 20);
        write(&mut *queue, offset, &data, false).unwrap();
        model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
    }
    let stats = cache.stats();
    assert!(stats.journal_used_bytes <= stats.journal_ring_bytes);
    array.crash();
    let after = device.after_crash();
    std::mem::forget(queue);
    std::mem::forget(cache);
    assert!(
        array.contents() != model,
        "the last write is in the journal only"
    );
    // The replay's own writes need no delay (a late write-back of the
    // forgotten cache carries the newest bytes of its pages: harmless).
    array.update_faults(|f| f.latency = Duration::ZERO);
    let (_, replayed) = open_journal(&after, &array);
    assert!(replayed.records > 0);
    assert!(array.contents() == model);
}

#[test]
fn a_failed_journal_refuses_writes_and_keeps_what_it_acknowledged() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let device = MemJournal::new(16 << 20);
    let (journal, _) = open_journal(&device, &array);
    let cache = small_cache(CacheMode::Journal, Some(journal), &array);
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    let kept = pattern(3, 65536);
    write(&mut *queue, 0, &kept, false).unwrap();
    *device.broken.lock().unwrap() = true;
    assert_eq!(
        write(&mut *queue, 1 << 20, &[1u8; 4096], false),
        Err(libc::EIO)
    );
    assert_eq!(
        write(&mut *queue, 2 << 20, &[1u8; 4096], false),
        Err(libc::EIO)
    );
    let failure = cache.stats().failure.expect("the failure is reported");
    assert!(failure.contains("mem-journal"), "{failure}");
    // Reads go on, and what the journal acknowledged reaches the array.
    assert_eq!(read(&mut *queue, 0, 65536), kept);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while array.durable_contents()[..65536] != kept[..] {
        assert!(
            std::time::Instant::now() < deadline,
            "acknowledged data never reached the array"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_journal_of_another_array_or_too_small_is_refused() {
    let device = MemJournal::new(16 << 20);
    let sb = journal::new_superblock(device.size_bytes(), [1; 16], [2; 16]);
    journal::write_superblock(&device, &sb).unwrap();
    let error = journal::read_superblock(&device, &ARRAY_UUID)
        .unwrap_err()
        .to_string();
    assert!(error.contains("another array"), "{error}");
    let small = MemJournal::new(1 << 20);
    let error = journal::read_superblock(&small, &ARRAY_UUID)
        .unwrap_err()
        .to_string();
    assert!(error.contains("too small"), "{error}");
    let _: Option<Superblock> =
        journal::read_superblock(&MemJournal::new(16 << 20), &ARRAY_UUID).unwrap();
}

#[test]
fn a_full_cache_over_a_failing_array_refuses_writes_instead_of_waiting() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let cache = small_cache(CacheMode::WriteBack, None, &array);
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    // Every write to the array fails from now on.
    array.fail_between(Some((0, ARRAY_BYTES)));
    let started = std::time::Instant::now();
    let mut refused = None;
    for i in 0..64u64 {
        if let Err(errno) = write(&mut *queue, i * 65536, &pattern(i, 65536), false) {
            refused = Some(errno);
            break;
        }
    }
    assert_eq!(
        refused,
        Some(libc::EIO),
        "writes past the bound were not refused"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // A FLUSH reports the failure too, and close says what is left.
    assert!(run(&mut *queue, OpKind::Flush, 0, 0, false).is_err());
    drop(queue);
    assert!(cache
        .close()
        .unwrap_err()
        .to_string()
        .contains("could not be written"));
}

/// nvraid's journal, slow: to say how full it is (whoever asks holds their
/// locks a while longer), and to start an append (a writer past the
/// cache's room check reaches the journal's lock later). Race windows
/// made wide.
struct Slow(Journal);

impl nvraid_cache::journal::JournalLog for Slow {
    fn name(&self) -> String {
        self.0.name()
    }
    fn append(
        &self,
        offset: u64,
        data: &[u8],
        _: journal::Prepared,
    ) -> Result<Option<u64>, String> {
        std::thread::sleep(Duration::from_millis(1));
        self.0.append(offset, data).map(Some)
    }
    fn commit_or_wait(&self, ticket: u64, timeout: Option<Duration>) -> journal::Commit {
        self.0.commit_or_wait(ticket, timeout)
    }
    fn committed(&self) -> (u64, bool) {
        self.0.committed()
    }
    fn failure(&self) -> Option<String> {
        self.0.failure()
    }
    fn usage(&self) -> (u64, u64) {
        std::thread::sleep(Duration::from_millis(2));
        self.0.usage()
    }
    fn wants_room(&self) -> bool {
        self.0.wants_room()
    }
    fn head(&self) -> (u64, u64) {
        self.0.head()
    }
    fn set_tail(&self, tail: u64, tail_seq: u64) -> io::Result<()> {
        self.0.set_tail(tail, tail_seq)
    }
    fn mark_failed(&self, why: String) {
        self.0.mark_failed(why)
    }
}

/// The write-back thread's periodic look at the journal once took the
/// journal's lock under the cache's, while a writer takes the cache's under
/// the journal's (its write enters the cache as it is appended): the two
/// deadlocked (`nvraid serve --cache journal` stopped for good, once, in a
/// 20 s benchmark). With an expire period of a millisecond and a slow
/// journal, that look runs all the time and both windows are wide; two
/// writers must still finish.
#[test]
fn journal_mode_writers_and_the_aged_write_back_never_deadlock() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let device = MemJournal::new(16 << 20);
    let (journal, _) = open_journal(&device, &array);
    let cache = Arc::new(journal_cache(
        &array,
        Box::new(Slow(journal)),
        Duration::from_millis(1),
    ));
    let (done, finished) = std::sync::mpsc::channel();
    for seed in [7u64, 8] {
        let (cache, done) = (cache.clone(), done.clone());
        std::thread::spawn(move || {
            let mut queue = cache.open_queue(4, 1 << 20).unwrap();
            let mut rng = Rng(seed);
            let blocks = ARRAY_BYTES / 4096;
            for _ in 0..500 {
                let first = rng.block(blocks - 1);
                write(&mut *queue, first * 4096, &pattern(rng.next(), 4096), false).unwrap();
            }
            let _ = done.send(());
        });
    }
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("a writer stopped making progress (deadlock)");
    }
}

/// Write-back mode starts writing back once dirty data passes the
/// background threshold, not at the next expire period: with an hour-long
/// period, 512 KiB written over a 256 KiB threshold reach the array
/// without a FLUSH, and the cache holds no more than the threshold after.
/// (It used to wait for the period, or for a full cache.)
#[test]
fn write_back_starts_at_the_background_threshold() {
    let array = MemTarget::mem(ARRAY_BYTES);
    let cache = CachedTarget::new(
        Arc::new(array.clone()),
        CacheMode::WriteBack,
        None,
        CacheOptions {
            dirty_max_bytes: 1 << 20,
            background_bytes: 256 * KIB as u64,
            expire: Duration::from_secs(3600),
        },
        quiet(),
    )
    .unwrap();
    let mut queue = cache.open_queue(1, 1 << 20).unwrap();
    let data = pattern(21, 512 * KIB);
    for (i, page) in data.chunks(4096).enumerate() {
        write(&mut *queue, (i * 4096) as u64, page, false).unwrap();
    }
    let start = std::time::Instant::now();
    while cache.stats().dirty_bytes > 256 * KIB as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} bytes still dirty over a 256 KiB threshold",
            cache.stats().dirty_bytes
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // What was written back is on the array as written (the array's
    // current contents: no FLUSH was asked for).
    let on_array = array.contents();
    let back = data
        .chunks(4096)
        .enumerate()
        .filter(|(i, page)| on_array[i * 4096..(i + 1) * 4096] == page[..])
        .count();
    assert!(back * 4096 >= 256 * KIB, "{back} pages reached the array");
}
