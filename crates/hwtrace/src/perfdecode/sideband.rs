//! What the perf.data sideband says about the traced processes: which
//! thread belongs to which process, the executable mappings of each
//! process (MMAP2/MMAP), the build ids of the files, and which threads ran
//! on each CPU (SWITCH, SWITCH_CPU_WIDE, ITRACE_START).

use std::collections::{BTreeMap, BTreeSet};

use hwtrace_perf::data::{Features, FileOffset, PerfData, PerfRecord};
use hwtrace_perf::pevent::record::Body;

/// `PERF_RECORD_MISC_MMAP_DATA`: a data mapping (MMAP records carry no
/// protection bits, this says the mapping is not code).
const MISC_MMAP_DATA: u16 = 1 << 13;

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
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Sideband {
    /// Walks the records once.
    pub fn collect(file: &PerfData<'_>) -> Self {
        let mut sb = Sideband::default();
        let mut records = file.records();
        for item in &mut records {
            let Ok(item) = item else { continue };
            let PerfRecord::Event(r) = item.record else {
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
                    });
                }
                Body::Comm(c) => {
                    sb.pid_of.insert(c.tid, c.pid);
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
        let features: &Features<'_> = if file.header.is_pipe() {
            records.pipe_features()
        } else {
            &file.features
        };
        for list in sb.switches.values_mut() {
            list.sort_by_key(|&(time, _)| time);
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

    /// How many threads ran on `cpu`.
    pub fn thread_count_on(&self, cpu: u32) -> usize {
        self.threads_on_cpu
            .get(&cpu)
            .map_or(0, |t| t.iter().filter(|&&t| t != 0).count())
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
