//! Which job holds which MIG instance on this node.
//!
//! A START whose GPU slot is a MIG slice (`mig_compute > 0`) gets a free instance of
//! exactly that size on that GPU, claimed until the worker ends; a bigger instance is
//! never substituted, because the scheduler counts the rest of the GPU as free for other
//! jobs. No match is a failed start with the reason, so the scheduler requeues the job
//! (the node's MIG layout does not offer what its inventory says). An agent without
//! NVML (the simulated source) has no instances to hand out: the environment then keeps
//! the GPU index and `MARSHAL_MIG_PROFILE`, as the scheduler sent them.

use std::collections::HashMap;

use marshal_telemetry::MigInstance;

use crate::connected::jobs::Incarnation;

#[derive(Debug, Default)]
pub struct MigPool {
    instances: Vec<MigInstance>,
    /// UUID → the worker holding it.
    held: HashMap<String, Incarnation>,
}

impl MigPool {
    /// The node's instances, as NVML listed them (empty: no MIG to hand out).
    pub fn new(instances: Vec<MigInstance>) -> MigPool {
        MigPool {
            instances,
            held: HashMap::new(),
        }
    }

    /// Claims a free instance of `compute`/`memory` slices on `gpu` for `worker`:
    /// `Ok(None)` when this agent has no MIG inventory at all, the instance otherwise. A
    /// worker that already holds one on that GPU keeps it (a repeated START).
    pub fn claim(
        &mut self,
        worker: Incarnation,
        gpu: u32,
        compute: u8,
        memory: u8,
    ) -> Result<Option<&MigInstance>, String> {
        if self.instances.is_empty() {
            return Ok(None);
        }
        let fits = |m: &MigInstance| m.gpu == gpu && m.compute == compute && m.memory == memory;
        let pick = self
            .instances
            .iter()
            .position(|m| fits(m) && self.held.get(&m.uuid) == Some(&worker))
            .or_else(|| {
                self.instances
                    .iter()
                    .position(|m| fits(m) && !self.held.contains_key(&m.uuid))
            });
        let Some(i) = pick else {
            let on_gpu: Vec<String> = self
                .instances
                .iter()
                .filter(|m| m.gpu == gpu)
                .map(|m| {
                    let state = if self.held.contains_key(&m.uuid) {
                        "held"
                    } else {
                        "free"
                    };
                    format!("{} ({}c/{}m, {state})", m.profile, m.compute, m.memory)
                })
                .collect();
            return Err(format!(
                "no free MIG instance of {compute} compute / {memory} memory slices on GPU {gpu} (it has: {})",
                if on_gpu.is_empty() {
                    "none; MIG is off or not configured".to_string()
                } else {
                    on_gpu.join(", ")
                }
            ));
        };
        let m = &self.instances[i];
        self.held.insert(m.uuid.clone(), worker);
        Ok(Some(m))
    }

    /// Marks `uuid` held by `worker` again: an adopted worker keeps the instance it was
    /// started with. An instance no longer in the inventory (MIG re-partitioned) cannot
    /// be handed out anyway; one claimed by another worker means two records claim it.
    pub fn restore(&mut self, worker: Incarnation, uuid: &str) -> Result<(), String> {
        if !self.instances.iter().any(|m| m.uuid == uuid) {
            return Err(format!("MIG instance {uuid} is not on this node any more"));
        }
        match self.held.get(uuid) {
            Some(other) if *other != worker => Err(format!(
                "MIG instance {uuid} is held by job {} worker {} already",
                other.job, other.worker
            )),
            _ => {
                self.held.insert(uuid.to_string(), worker);
                Ok(())
            }
        }
    }

    /// Frees whatever `worker` holds.
    pub fn release(&mut self, worker: Incarnation) {
        self.held.retain(|_, w| *w != worker);
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(gpu: u32, n: u32, compute: u8, memory: u8) -> MigInstance {
        MigInstance {
            gpu,
            uuid: format!("MIG-{gpu}-{n}"),
            profile: format!("{compute}g.{}gb", u32::from(memory) * 10),
            compute,
            memory,
        }
    }

    fn worker(job: u64) -> Incarnation {
        Incarnation {
            job,
            worker: 0,
            attempt: 1,
        }
    }

    #[test]
    fn exact_sizes_are_claimed_once_and_freed_at_the_end() {
        let mut pool = MigPool::new(vec![
            inst(0, 0, 3, 4),
            inst(0, 1, 1, 1),
            inst(0, 2, 1, 1),
            inst(1, 0, 1, 1),
        ]);
        let a = pool
            .claim(worker(1), 0, 1, 1)
            .unwrap()
            .unwrap()
            .uuid
            .clone();
        assert_eq!(a, "MIG-0-1");
        // A repeated START keeps the same instance.
        assert_eq!(pool.claim(worker(1), 0, 1, 1).unwrap().unwrap().uuid, a);
        let b = pool
            .claim(worker(2), 0, 1, 1)
            .unwrap()
            .unwrap()
            .uuid
            .clone();
        assert_eq!(b, "MIG-0-2");
        // Both 1-slice instances of GPU 0 are held; the 3g one is not handed out instead.
        let err = pool.claim(worker(3), 0, 1, 1).unwrap_err();
        assert!(
            err.contains("GPU 0") && err.contains("3g.40gb (3c/4m, free)"),
            "{err}"
        );
        assert!(err.contains("1g.10gb (1c/1m, held)"), "{err}");
        pool.release(worker(1));
        assert_eq!(pool.held(), 1);
        assert_eq!(
            pool.claim(worker(3), 0, 1, 1).unwrap().unwrap().uuid,
            "MIG-0-1"
        );
        let err = pool.claim(worker(4), 2, 1, 1).unwrap_err();
        assert!(err.contains("MIG is off"), "{err}");
    }

    #[test]
    fn a_restored_claim_is_not_handed_out_again() {
        let mut pool = MigPool::new(vec![inst(0, 0, 1, 1), inst(0, 1, 1, 1)]);
        pool.restore(worker(1), "MIG-0-0").unwrap();
        assert_eq!(
            pool.claim(worker(2), 0, 1, 1).unwrap().unwrap().uuid,
            "MIG-0-1"
        );
        assert!(pool.claim(worker(3), 0, 1, 1).is_err());
        assert!(
            pool.restore(worker(3), "MIG-0-0")
                .unwrap_err()
                .contains("job 1")
        );
        assert!(pool.restore(worker(3), "MIG-9-9").is_err());
        pool.release(worker(1));
        assert_eq!(
            pool.claim(worker(3), 0, 1, 1).unwrap().unwrap().uuid,
            "MIG-0-0"
        );
    }

    #[test]
    fn without_an_inventory_nothing_is_claimed() {
        let mut pool = MigPool::default();
        assert_eq!(pool.claim(worker(1), 0, 1, 1).unwrap(), None);
        assert_eq!(pool.held(), 0);
    }
}
