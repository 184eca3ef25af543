//! What the perf.data sideband says about the traced processes: which
//! thread belongs to which process, the executable mappings of each
//! process (MMAP2/MMAP), the build ids of the files, and which threads ran
//! on each CPU (SWITCH, SWITCH_CPU_WIDE, ITRACE_START).

use std::collections::{BTreeMap, BTreeSet};

use hwtrace_perf::data::{FileOffset, PerfData, PerfRecord};
use hwtrace_perf::pevent::record::Body;

/// `PERF_RECORD_MISC_MMAP_DATA`: a data mapping (MMAP records carry no
/// protection bits, this says the mapping is not code).
const MISC_MMAP_DATA: u16 = 1 << 13;

/// `PERF_RECORD_MISC_COMM_EXEC`: the COMM record of an exec.
const MISC_COMM_EXEC: u16 = 1 << 13;

/// `PROT_EXEC` of mmap(2).
const PROT_EXEC: u32 = 4;

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The MMAP/MMAP2 record's file offset.
    pub record_offset: FileOffset,
    /// The process.
    pub pid: u32,
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset in the file of the first byte.
    pub pgoff: u64,
    /// The file name as recorded (`[vdso]`, `[kernel.kallsyms]_text`, a
    /// path...).
    pub filename: String,
    /// The build id the MMAP2 record carries, if any.
    pub build_id: Option<Vec<u8>>,
    /// The record's perf time, if its `sample_id` has one: which program
    /// of the process (before or after an exec) it belongs to.
    pub time: Option<u64>,
}

impl Mapping {
    /// Whether `ip` falls inside.
    pub fn contains(&self, ip: u64) -> bool {
        ip.wrapping_sub(self.addr) < self.len
    }
}

/// The sideband of a perf.data file, reduced to what decoding needs.
#[derive(Clone, Debug, Default)]
pub struct Sideband {
    /// Executable mappings, in file order.
    pub mappings: Vec<Mapping>,
    /// tid → pid, from every record that names both.
    pub pid_of: BTreeMap<u32, u32>,
    /// The threads seen running on each CPU (switch-in records, switch-out
    /// records of CPU-wide switches and ITRACE_START).
    pub threads_on_cpu: BTreeMap<u32, BTreeSet<u32>>,
    /// Build ids from the `HEADER_BUILD_ID` feature: file name → id.
    pub build_ids: BTreeMap<String, Vec<u8>>,
    /// Per CPU, the threads switched in, with the perf time of the switch
    /// (records without a time are left out), in time order.
    pub switches: BTreeMap<u32, Vec<(u64, u32)>>,
    /// Per process, the perf times of its execs (COMM records flagged
    /// `PERF_RECORD_MISC_COMM_EXEC` with a time), in time order: each
    /// exec starts a new program with new mappings.
    pub execs: BTreeMap<u32, Vec<u64>>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Sideband {
    /// Walks the records once.
    pub fn collect(file: &PerfData<'_>) -> Self {
        let mut sb = Sideband::default();
        let mut records = file.records();
        // `perf record -z` puts the sideband inside COMPRESSED records:
        // walk the expanded stream, or mappings and switches go missing.
        // Records that fail to parse are reported by the AUX stream pass.
        while let Some(expanded) = records.next_expanded().transpose() {
            let Ok(expanded) = expanded else { continue };
            let item = expanded.item();
            let PerfRecord::Event(r) = item.record.clone() else {
                continue;
            };
            if let Some((pid, tid)) = r.sample.pid_tid
                && pid != u32::MAX
            {
                sb.pid_of.entry(tid).or_insert(pid);
            }
            let mut on_cpu = |tid: u32, switched_in: bool| {
                if let Some(cpu) = r.sample.cpu {
                    sb.threads_on_cpu.entry(cpu).or_default().insert(tid);
                    if switched_in && let Some(time) = r.sample.time {
                        sb.switches.entry(cpu).or_default().push((time, tid));
                    }
                }
            };
            match r.body {
                Body::Mmap2(m) if m.prot & PROT_EXEC != 0 => {
                    sb.pid_of.insert(m.tid, m.pid);
                    sb.mappings.push(Mapping {
                        record_offset: item.offset,
                        pid: m.pid,
                        addr: m.addr,
                        len: m.len,
                        pgoff: m.pgoff,
                        filename: text(m.filename),
                        build_id: m.build_id(r.header.misc).map(<[u8]>::to_vec),
                        time: r.sample.time,
                    });
                }
                Body::Mmap(m) if r.header.misc & MISC_MMAP_DATA == 0 => {
                    sb.pid_of.insert(m.tid, m.pid);
                    sb.mappings.push(Mapping {
                        record_offset: item.offset,
                        pid: m.pid,
                        addr: m.addr,
                        len: m.len,
                        pgoff: m.pgoff,
                        filename: text(m.filename),
                        build_id: None,
                        time: r.sample.time,
                    });
                }
                Body::Comm(c) => {
                    sb.pid_of.insert(c.tid, c.pid);
                    if r.header.misc & MISC_COMM_EXEC != 0
                        && let Some(time) = r.sample.time
                    {
                        sb.execs.entry(c.pid).or_default().push(time);
                    }
                }
                Body::ItraceStart(s) => {
                    sb.pid_of.insert(s.tid, s.pid);
                    on_cpu(s.tid, false);
                }
                Body::Switch if !r.is_switch_out() => {
                    if let Some((_, tid)) = r.sample.pid_tid {
                        on_cpu(tid, true);
                    }
                }
                Body::SwitchCpuWide(s) => {
                    sb.pid_of.insert(s.next_prev_tid, s.next_prev_pid);
                    // Switch out names the next thread (it runs from now
                    // on); switch in names the previous one, and the sample
                    // the thread now running.
                    let out = r.is_switch_out();
                    on_cpu(s.next_prev_tid, out);
                    if let Some((_, tid)) = r.sample.pid_tid {
                        on_cpu(tid, !out);
                    }
                }
                _ => {}
            }
        }
        let features = file.features_after(&records);
        for list in sb.switches.values_mut() {
            list.sort_by_key(|&(time, _)| time);
        }
        for list in sb.execs.values_mut() {
            list.sort_unstable();
            list.dedup();
        }
        for b in &features.build_ids {
            sb.build_ids.insert(text(b.filename), b.build_id.to_vec());
        }
        sb
    }

    /// The single thread that ran on `cpu` (ignoring the idle task, tid 0),
    /// if the sideband names exactly one.
    pub fn only_thread_on(&self, cpu: u32) -> Option<u32> {
        let threads = self.threads_on_cpu.get(&cpu)?;
        let mut busy = threads.iter().filter(|&&t| t != 0);
        let first = busy.next()?;
        busy.next().is_none().then_some(*first)
    }

    /// The thread switched in last on `cpu` at or before perf time `time`.
    pub fn thread_at(&self, cpu: u32, time: u64) -> Option<u32> {
        let list = self.switches.get(&cpu)?;
        let n = list.partition_point(|&(t, _)| t <= time);
        n.checked_sub(1).map(|i| list[i].1)
    }

    /// How many programs process `pid` ran: one more than its timed execs.
    pub fn generations(&self, pid: u32) -> usize {
        self.execs.get(&pid).map_or(0, Vec::len) + 1
    }

    /// Which program of process `pid` runs at perf time `time`: the
    /// number of its execs at or before it.
    pub fn generation_at(&self, pid: u32, time: u64) -> usize {
        self.execs
            .get(&pid)
            .map_or(0, |e| e.partition_point(|&t| t <= time))
    }

    /// The program of its process mapping `m` belongs to (`None`: untimed,
    /// every one).
    pub fn generation_of(&self, m: &Mapping) -> Option<usize> {
        m.time.map(|t| self.generation_at(m.pid, t))
    }

    /// How many threads ran on `cpu`.
    pub fn thread_count_on(&self, cpu: u32) -> usize {
        self.threads_on_cpu
            .get(&cpu)
            .map_or(0, |t| t.iter().filter(|&&t| t != 0).count())
    }

    /// The processes whose threads timed switch records put on `cpu` (the
    /// idle task, tid 0, left out): the code a per-CPU queue may run.
    pub fn pids_switched_in(&self, cpu: u32) -> BTreeSet<u32> {
        let on_cpu = self.switches.get(&cpu).into_iter().flatten();
        on_cpu
            .filter(|&&(_, t)| t != 0)
            .filter_map(|&(_, t)| self.pid_of.get(&t).copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_at_a_time_is_the_last_switched_in() {
        let mut sb = Sideband::default();
        sb.switches
            .insert(0, vec![(100, 7), (200, 8), (200, 9), (300, 0)]);
        assert_eq!(sb.thread_at(0, 99), None);
        assert_eq!(sb.thread_at(0, 100), Some(7));
        assert_eq!(sb.thread_at(0, 199), Some(7));
        assert_eq!(sb.thread_at(0, 200), Some(9));
        assert_eq!(sb.thread_at(0, 1000), Some(0));
        assert_eq!(sb.thread_at(1, 1000), None);
    }

    #[test]
    fn execs_split_a_process_into_programs() {
        let mut sb = Sideband::default();
        sb.execs.insert(7, vec![100, 200]);
        assert_eq!(sb.generations(7), 3);
        assert_eq!(sb.generations(8), 1);
        assert_eq!(
            [0, 99, 100, 199, 200, 1000].map(|t| sb.generation_at(7, t)),
            [0, 0, 1, 1, 2, 2]
        );
        let m = Mapping {
            record_offset: FileOffset(0),
            pid: 7,
            addr: 0x1000,
            len: 0x1000,
            pgoff: 0,
            filename: "/bin/x".into(),
            build_id: None,
            time: Some(150),
        };
        assert_eq!(sb.generation_of(&m), Some(1));
        assert_eq!(sb.generation_of(&Mapping { time: None, ..m }), None);
    }

    #[test]
    fn one_busy_thread_on_a_cpu_is_its_thread() {
        let mut sb = Sideband::default();
        sb.threads_on_cpu.insert(0, BTreeSet::from([0, 5]));
        sb.threads_on_cpu.insert(1, BTreeSet::from([5, 6]));
        assert_eq!(sb.only_thread_on(0), Some(5));
        assert_eq!(sb.only_thread_on(1), None);
        assert_eq!(sb.thread_count_on(1), 2);
        assert_eq!(sb.only_thread_on(2), None);
    }
}
