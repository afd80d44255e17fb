use super::*;

#[test]
fn a_refusal_is_named_after_the_limit_that_made_it() {
    let mut levels = RuleTable::default();
    levels.insert(3, "web", &["prefix/24/48@1s", "rule@1m"]);
    let event = LimitEvent::new(SourceKey::v4([192, 0, 2, 1]), 3, 1_000, false);
    assert_eq!(level_label(&event, &levels), "source");
    assert_eq!(level_label(&event.with_level(2), &levels), "rule@1m");
    assert_eq!(
        level_label(&event.with_level(1), &levels),
        "prefix/24/48@1s"
    );
    // A rule the labels do not know (pushed meanwhile): its index.
    assert_eq!(level_label(&event.with_level(4), &levels), "#3");
}

fn event(last_octet: u8, rule: u32, at_ns: u64) -> LimitEvent {
    LimitEvent::new(SourceKey::v4([192, 0, 2, last_octet]), rule, at_ns, false)
}

/// What `run` logs, as text (one line per event).
fn logged(run: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, run);
    let text = sink.0.lock().expect("sink").clone();
    String::from_utf8(text).expect("utf-8")
}

fn cap(per_second: u32, burst: u32, counter: &IntCounter, now: Instant) -> SharedLogCap {
    SharedLogCap::new(LogCap::new(per_second, burst, counter.clone(), now))
}

#[test]
fn a_flood_of_episodes_is_logged_within_the_cap_and_the_rest_summed_up() {
    let counter = IntCounter::new("suppressed", "test").expect("counter");
    let start = Instant::now();
    let shared = cap(10, 20, &counter, start);
    let names = SharedRuleTable::default();
    // Two interfaces share the one cap.
    let mut eth0 = Handler::new("eth0".into(), names.clone(), shared.clone());
    let mut eth1 = Handler::new("eth1".into(), names, shared.clone());
    let mut sent = 0u32;
    let mut flood = |handler: &mut Handler, at: Instant, n: u32| {
        for _ in 0..n {
            // A new forged source each time: each its own episode.
            let key = SourceKey::v4((0x0a00_0000 + sent).to_be_bytes());
            handler.handle(&LimitEvent::new(key, 0, 1_000, false), at);
            sent += 1;
        }
    };
    let log = logged(|| {
        // 64 events per CPU and second on 2 CPUs, for 3 seconds, on
        // each interface.
        for second in 0..3 {
            let at = start + Duration::from_secs(second);
            flood(&mut eth0, at, 128);
            flood(&mut eth1, at, 128);
        }
        shared.flush(start + Duration::from_secs(9));
        shared.flush(start + SUMMARY_PERIOD);
        shared.flush(start + SUMMARY_PERIOD + Duration::from_secs(1));
    });
    let lines = log.lines().filter(|l| l.contains("source limited")).count();
    // The burst, then 10 a second for the two seconds after.
    assert_eq!(lines, 20 + 2 * 10, "{log}");
    let suppressed = 3 * 256 - lines as u64;
    assert_eq!(counter.get(), suppressed);
    let summaries: Vec<&str> = log.lines().filter(|l| l.contains("suppressed")).collect();
    assert_eq!(summaries.len(), 1, "one summary per period:\n{log}");
    assert!(
        summaries[0].contains(&format!(
            "{suppressed} source-limited lines suppressed in the last 10s"
        )),
        "{log}"
    );
}

#[test]
fn the_cap_refills_at_its_rate_up_to_its_burst_and_zero_writes_none() {
    let counter = IntCounter::new("suppressed", "test").expect("counter");
    let start = Instant::now();
    let mut cap = LogCap::new(10, 3, counter.clone(), start);
    let admitted =
        |cap: &mut LogCap, at: Instant, n: usize| (0..n).filter(|_| cap.admit(at)).count();
    assert_eq!(admitted(&mut cap, start, 5), 3, "the burst");
    assert_eq!(admitted(&mut cap, start + Duration::from_millis(150), 5), 1);
    assert_eq!(
        admitted(&mut cap, start + Duration::from_secs(60), 5),
        3,
        "no more than the burst"
    );
    assert_eq!(counter.get(), 4 + 2 + 2);
    assert_eq!(
        cap.summary(start + Duration::from_secs(5)),
        None,
        "a period is 10s"
    );
    assert_eq!(
        cap.summary(start + Duration::from_secs(60)),
        Some((8, Duration::from_secs(60)))
    );
    assert_eq!(
        cap.summary(start + Duration::from_secs(75)),
        None,
        "nothing since"
    );

    let mut none = LogCap::new(0, 3, counter, start);
    assert_eq!(admitted(&mut none, start + Duration::from_secs(60), 5), 0);
}

#[test]
fn cluster_hot_events_are_not_logged_as_limited() {
    assert!(is_logged(&event(1, 0, 1_000)));
    let hot = LimitEvent::cluster_hot(SourceKey::v4([192, 0, 2, 1]), 0, 1_000);
    assert!(!is_logged(&hot));
}

#[test]
fn the_other_cpus_events_of_an_episode_are_not_logged_again() {
    let mut episodes = Episodes::default();
    assert!(episodes.starts(&event(3, 0, 5_000)));
    assert!(!episodes.starts(&event(3, 0, 9_000)), "a second CPU");
    assert!(!episodes.starts(&event(3, 0, 4_000)), "out of order");
    assert!(episodes.starts(&event(4, 0, 9_000)), "another source");
    assert!(episodes.starts(&event(3, 1, 9_000)), "another rule");
    // A gap measured from the episode's latest event (9,000 ns).
    assert!(!episodes.starts(&event(3, 0, 9_000 + EPISODE_GAP_NS)));
    assert!(episodes.starts(&event(3, 0, 10_000 + 3 * EPISODE_GAP_NS)));
}

#[test]
fn ended_episodes_are_forgotten_when_many_are_kept() {
    let mut episodes = Episodes::default();
    for i in 0..EPISODES_KEPT as u32 {
        let key = SourceKey::v4(i.to_be_bytes());
        assert!(episodes.starts(&LimitEvent::new(key, 0, 1_000, false)));
    }
    let later = 2_000 + 2 * EPISODE_GAP_NS;
    assert!(episodes.starts(&event(3, 0, later)));
    assert_eq!(episodes.last.len(), 1, "only the live episode is kept");
}
