//! fairstream's compiled path (docs/architecture.md, "The compiled path"): `serve_flat`, below,
//! and pieces of per-event arithmetic at the end of this file, each the twin of the numpy it stands in for.
//!
//! `serve_flat`: one scheduling pass of the flat fair policies (`drf`,
//! `fair`, `ltrf`) as `fairstream.core.placement.serve_in_order` makes it, for the passes
//! where none of its other features is in play (no queue limits or job orderings, no task
//! constraints, no alignment, no backfill, no preemption).
//!
//! The pass reads the engine's pending queues (Python objects) where they are and works on
//! its own copies of free room and of the key vectors, so nothing in Python changes: it
//! returns the placements in order, each with the key its tenant had when it was served, and
//! the pass's first blocked entry; Python then records them as its `Cycle`'s decisions, as
//! the Python pass would have made them. A task with constraints ends it with None (the Python
//! pass runs instead).
//!
//! The Python pass is the reference: every rule here names the Python it follows, and
//! `tests/core/test_native.py` checks the two give the same decisions.

use std::borrow::Cow;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1, PyReadwriteArray2};
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

/// A tenant's place in the order of service: `fairness.FairKey` with the NORMAL priority
/// (no min shares here): share, then arrival, then name; floats compared as Python does.
#[derive(Clone, Debug)]
struct Key<'py> {
    share: f64,
    arrival: f64,
    name: Bound<'py, PyString>, // the caller's string: a key costs a reference, not a copy
}

impl Key<'_> {
    fn name(&self) -> &str {
        self.name.to_str().unwrap_or("") // (a str's UTF-8, held by the string; tenant names are valid str)
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Key<'_> {}
impl PartialOrd for Key<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.share
            .partial_cmp(&other.share)
            .unwrap_or(Ordering::Equal)
            .then(self.arrival.partial_cmp(&other.arrival).unwrap_or(Ordering::Equal))
            .then_with(|| self.name().cmp(other.name())) // UTF-8 byte order is code point order
    }
}

/// The hash of the pass's own maps, keyed by numbers the engine made (shape ids, tenant
/// indices, node rows), never by what a client sent: rustc's multiply-rotate hash (Fx).
/// SipHash, the default, was a tenth of a pass.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n)
    }
    fn write_i64(&mut self, n: i64) {
        self.add(n as u64)
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64)
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
type FxSet<K> = HashSet<K, BuildHasherDefault<Fx>>;

/// What the pass needs of one task shape (demand and constraints, interned by the engine).
struct Shape {
    demand: Vec<f64>,
    need: Vec<f64>, // demand - EPSILON, as `Cycle.find_node`
}

struct Tenant<'py> {
    name: Bound<'py, PyString>, // the caller's string: dict lookups reuse its hash, results hand it back
    row: usize,
    groups: Option<Bound<'py, PyDict>>, // `PendingQueue.groups`: shape -> TaskList (on first use)
    heads: Option<BinaryHeap<Reverse<(i64, i64)>>>, // (seq, shape), `Cycle._heads`
}

struct Group<'py> {
    tasks: Bound<'py, PyList>,
    head: usize,
}

/// One entry of a queue as the pass sees it.
struct Entry<'py> {
    task: Bound<'py, PyAny>,
    seq: i64,
    shape: i64,
    count: i64,
}

struct Pass<'py> {
    pending: Bound<'py, PyDict>,
    rows: Bound<'py, PyDict>,
    names: Bound<'py, PyList>, // tenant names by row (`Snapshot.tenants`)
    pending_state: Bound<'py, PyAny>, // TaskState.PENDING
    eps: f64,
    nres: usize,
    nnodes: usize,
    free: Vec<f64>,
    capacity: Vec<f64>,
    resource: Option<usize>,
    vectors: Vec<f64>, // the key's vector per row: allocation (drf, fair) or accumulated usage (ltrf)
    charge: Option<Vec<f64>>, // per row: a placement adds charge * demand (ltrf's quantum), else the demand
    extra: Option<Vec<f64>>,  // per row: added to the share (ltrf's pseudo accumulated usage)
    fraction: Vec<f64>,
    arrival: Vec<f64>,
    tenants: Vec<Tenant<'py>>,
    groups: FxMap<(usize, i64), Group<'py>>,
    cursor: FxMap<(usize, i64), (usize, i64)>, // `Cycle._cursor`: (offset, within)
    shapes: FxMap<i64, Shape>,
    candidates: FxMap<i64, (Vec<usize>, usize)>, // `Cycle._candidates`
    failed_shapes: FxSet<i64>,
    too_large: Vec<Vec<f64>>,
    grown: Option<Vec<usize>>,
    fresh: FxSet<i64>,
    grown_demands: Option<Vec<Vec<f64>>>,
    room_rows: Option<FxSet<usize>>,
    room_lost: Vec<usize>,
    reservation: Option<(usize, i64)>, // (node, shape)
    reserving: bool,
    blocked: Option<(usize, Bound<'py, PyAny>)>,
    placements: Vec<(usize, Bound<'py, PyAny>, usize, f64, i64)>, // (tenant, entry, node, key share, within)
}

/// Raised inside the pass when it meets what only the Python pass handles.
struct Unsupported;

enum Stop {
    Unsupported,
    Error(PyErr),
}
impl From<PyErr> for Stop {
    fn from(err: PyErr) -> Self {
        Stop::Error(err)
    }
}
impl From<Unsupported> for Stop {
    fn from(_: Unsupported) -> Self {
        Stop::Unsupported
    }
}

type R<T> = Result<T, Stop>;

impl<'py> Pass<'py> {
    fn row_free(&self, node: usize) -> &[f64] {
        &self.free[node * self.nres..(node + 1) * self.nres]
    }

    /// `fairness.resource_share` of a row of the key vectors, plus `extra`, over the weight
    /// (`FlatKey.initial_shares`, and the policy's key after a placement).
    fn share_of(&self, row: usize) -> f64 {
        let vec = &self.vectors[row * self.nres..(row + 1) * self.nres];
        let mut share = share_of_row(vec, &self.capacity, self.resource);
        if let Some(extra) = &self.extra {
            share += extra[row];
        }
        share / self.fraction[row]
    }

    fn key_of(&self, t: usize) -> Key<'py> {
        let tenant = &self.tenants[t];
        Key { share: self.share_of(tenant.row), arrival: self.arrival[tenant.row], name: tenant.name.clone() }
    }

    fn group(&mut self, t: usize, shape: i64) -> PyResult<Option<&Group<'py>>> {
        if !self.groups.contains_key(&(t, shape)) {
            let Some(list) = self.groups_of(t)?.get_item(shape)? else { return Ok(None) };
            let tasks = list.getattr(intern!(self.pending.py(), "tasks"))?.cast_into::<PyList>()?;
            let head: usize = list.getattr(intern!(self.pending.py(), "head"))?.extract()?;
            self.groups.insert((t, shape), Group { tasks, head });
        }
        Ok(self.groups.get(&(t, shape)))
    }

    fn entry(&self, task: Bound<'py, PyAny>) -> PyResult<Entry<'py>> {
        Ok(Entry {
            seq: task.getattr(intern!(self.pending.py(), "seq"))?.extract()?,
            shape: task.getattr(intern!(self.pending.py(), "shape"))?.extract()?,
            count: task.getattr(intern!(self.pending.py(), "count"))?.extract()?,
            task,
        })
    }

    fn is_pending(&self, task: &Bound<'py, PyAny>) -> PyResult<bool> {
        Ok(task.getattr(intern!(self.pending.py(), "state"))?.is(&self.pending_state))
    }

    /// `TaskList.next_from`: the first task not yet taken from `head + offset`, `within` in.
    fn next_from(&mut self, t: usize, shape: i64, offset: usize, within: i64) -> PyResult<(Option<Entry<'py>>, usize, i64)> {
        let Some(group) = self.group(t, shape)? else { return Ok((None, offset, 0)) };
        let (tasks, head) = (group.tasks.clone(), group.head);
        let mut i = head + offset;
        let mut within = within;
        let len = tasks.len();
        while i < len {
            let task = tasks.get_item(i)?;
            if self.is_pending(&task)? {
                let entry = self.entry(task)?;
                if within < entry.count {
                    return Ok((Some(entry), i - head, within));
                }
            }
            i += 1;
            within = 0;
        }
        Ok((None, i - head, 0))
    }

    /// `TaskList.pending_at(0)`: the first pending entry of a group.
    fn pending_at_start(&mut self, t: usize, shape: i64) -> PyResult<Option<Entry<'py>>> {
        let Some(group) = self.group(t, shape)? else { return Ok(None) };
        let (tasks, head) = (group.tasks.clone(), group.head);
        for i in head..tasks.len() {
            let task = tasks.get_item(i)?;
            if self.is_pending(&task)? {
                return Ok(Some(self.entry(task)?));
            }
        }
        Ok(None)
    }

    /// The demand of `entry`'s shape; a shape with constraints is not for this pass.
    fn shape(&mut self, entry: &Entry<'py>) -> R<()> {
        if !self.shapes.contains_key(&entry.shape) {
            let empty: bool = entry.task.getattr(intern!(self.pending.py(), "constraints"))?.getattr(intern!(self.pending.py(), "empty"))?.extract()?;
            if !empty {
                return Err(Unsupported.into());
            }
            let demand: Vec<f64> = entry.task.getattr(intern!(self.pending.py(), "demand_values"))?.extract()?;
            if demand.len() != self.nres {
                return Err(Unsupported.into());
            }
            let need = demand.iter().map(|d| d - self.eps).collect();
            self.shapes.insert(entry.shape, Shape { demand, need });
        }
        Ok(())
    }

    /// The tenant's `PendingQueue.groups`, looked up on first use.
    fn groups_of(&mut self, t: usize) -> PyResult<Bound<'py, PyDict>> {
        if self.tenants[t].groups.is_none() {
            let name = &self.tenants[t].name;
            let queue = self.pending.get_item(name)?.ok_or_else(|| PyKeyError::new_err(name.clone().unbind()))?;
            self.tenants[t].groups = Some(queue.getattr(intern!(self.pending.py(), "groups"))?.cast_into::<PyDict>()?);
        }
        Ok(self.tenants[t].groups.clone().unwrap())
    }

    /// Adds the tenant named `name` (its row from `rows`); returns its index.
    fn add_tenant(&mut self, name: Bound<'py, PyString>) -> PyResult<usize> {
        let row: usize = self.rows.get_item(&name)?.ok_or_else(|| PyKeyError::new_err(name.clone().unbind()))?.extract()?;
        self.tenants.push(Tenant { name, row, groups: None, heads: None });
        Ok(self.tenants.len() - 1)
    }

    fn shape_keys(&mut self, t: usize) -> PyResult<Vec<i64>> {
        let mut out = Vec::new();
        for key in self.groups_of(t)?.keys().iter() {
            out.push(key.extract::<i64>()?);
        }
        Ok(out)
    }

    /// `Cycle.next_task`: the tenant's earliest entry whose shape may still fit, or None.
    fn next_task(&mut self, t: usize) -> R<Option<Entry<'py>>> {
        if self.tenants[t].heads.is_none() {
            let mut heads = BinaryHeap::new();
            for shape in self.shape_keys(t)? {
                // A shape that fitted no node earlier in the pass would be popped unread: its
                // queue is not read (most of a pass's reads, when one node gained room).
                if self.failed_shapes.contains(&shape) {
                    continue;
                }
                if let Some(entry) = self.pending_at_start(t, shape)? {
                    heads.push(Reverse((entry.seq, shape)));
                }
            }
            self.tenants[t].heads = Some(heads);
        }
        loop {
            let Some(&Reverse((_, shape))) = self.tenants[t].heads.as_ref().unwrap().peek() else { return Ok(None) };
            if self.failed_shapes.contains(&shape) {
                self.tenants[t].heads.as_mut().unwrap().pop();
                continue;
            }
            let (offset, within) = self.cursor.get(&(t, shape)).copied().unwrap_or((0, 0));
            let (entry, _, _) = self.next_from(t, shape, offset, within)?;
            match entry {
                None => {
                    self.tenants[t].heads.as_mut().unwrap().pop();
                }
                Some(entry) => {
                    self.shape(&entry)?;
                    return Ok(Some(entry));
                }
            }
        }
    }

    /// `_first_short_of_room` for a tenant the pass has not served (`_first_blocked_of_all`):
    /// its first entry in arrival order (`Cycle.first_entry`) not kept off the reserved room
    /// (without caps or constraints, the only hold that is not short of room).
    fn first_short_of_room(&mut self, t: usize) -> R<Option<Entry<'py>>> {
        let mut heads: Vec<Entry<'py>> = Vec::new();
        for shape in self.shape_keys(t)? {
            let (offset, within) = self.cursor.get(&(t, shape)).copied().unwrap_or((0, 0));
            if let (Some(entry), _, _) = self.next_from(t, shape, offset, within)? {
                heads.push(entry);
            }
        }
        heads.sort_by_key(|entry| entry.seq); // stable, as Python's sort
        for entry in heads {
            self.shape(&entry)?;
            if !self.kept_off_reserved_room(entry.shape) {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// `Cycle._advance`: take the next task of the entry's shape for the tenant.
    /// Returns how many tasks of the entry the pass took before this one (its place in a request).
    fn advance(&mut self, t: usize, entry: &Entry<'py>) -> PyResult<i64> {
        let shape = entry.shape;
        let (offset, within) = self.cursor.get(&(t, shape)).copied().unwrap_or((0, 0));
        let (_, offset, within) = self.next_from(t, shape, offset, within)?;
        self.cursor.insert((t, shape), (offset, within + 1));
        if within + 1 < entry.count {
            return Ok(within);
        }
        let (next, _, _) = self.next_from(t, shape, offset, within + 1)?;
        let heads = self.tenants[t].heads.as_mut().unwrap();
        if heads.peek().is_some_and(|Reverse((_, s))| *s == shape) {
            heads.pop();
            if let Some(next) = next {
                heads.push(Reverse((next.seq, shape)));
            }
        } else {
            let mut rest: Vec<_> = heads.drain().filter(|Reverse((_, s))| *s != shape).collect();
            if let Some(next) = next {
                rest.push(Reverse((next.seq, shape)));
            }
            *heads = rest.into_iter().collect();
        }
        Ok(within)
    }

    fn fits_row(&self, node: usize, need: &[f64]) -> bool {
        self.row_free(node).iter().zip(need).all(|(have, want)| have >= want)
    }

    /// `Cycle.find_node` (first fit): the first node with room for the shape that it may use.
    fn find_node(&mut self, shape: i64) -> Option<usize> {
        if !self.candidates.contains_key(&shape) {
            if self.nnodes == 0 {
                return None;
            }
            let need = &self.shapes[&shape].need;
            let mut nodes: Vec<usize> = match &self.grown {
                Some(grown) if !self.fresh.contains(&shape) => {
                    grown.iter().copied().filter(|&n| self.fits_row(n, need)).collect()
                }
                _ => (0..self.nnodes).filter(|&n| self.fits_row(n, need)).collect(),
            };
            if let Some((node, held)) = self.reservation {
                if held != shape {
                    nodes.retain(|&n| n != node);
                }
            }
            self.candidates.insert(shape, (nodes, 0));
        }
        let need = self.shapes[&shape].need.clone();
        let (nodes, start) = self.candidates.get(&shape).unwrap();
        let mut i = *start;
        let mut found = None;
        while i < nodes.len() {
            if self.fits_row(nodes[i], &need) {
                found = Some(nodes[i]);
                break;
            }
            i += 1;
        }
        self.candidates.get_mut(&shape).unwrap().1 = i;
        found
    }

    /// `Cycle.kept_off_reserved_room` without backfill: the shape would fit the free room of
    /// the node reserved for another shape.
    fn kept_off_reserved_room(&self, shape: i64) -> bool {
        match self.reservation {
            Some((node, held)) if held != shape => {
                let demand = &self.shapes[&shape].demand;
                self.row_free(node).iter().zip(demand).all(|(have, want)| *have >= want - self.eps)
            }
            _ => false,
        }
    }

    /// `Cycle._blocked`: the first entry of the pass that fitted no node's free room.
    fn note_blocked(&mut self, t: usize, entry: &Entry<'py>) {
        if self.blocked.is_none() && !self.kept_off_reserved_room(entry.shape) {
            self.blocked = Some((t, entry.task.clone()));
        }
    }

    fn room_for_any(&self, node: usize) -> bool {
        let free = self.row_free(node);
        self.grown_demands
            .as_ref()
            .is_some_and(|demands| demands.iter().any(|d| d.iter().zip(free).all(|(want, have)| *want <= have + self.eps)))
    }

    /// `Cycle.out_of_room`: no grown row has room for a shape queued before the pass.
    fn out_of_room(&mut self) -> bool {
        if self.room_rows.is_none() || (self.blocked.is_none() && self.reserving) {
            return false;
        }
        let lost: Vec<usize> = std::mem::take(&mut self.room_lost);
        let full: Vec<usize> = lost.into_iter().filter(|&n| !self.room_for_any(n)).collect();
        let rows = self.room_rows.as_mut().unwrap();
        for node in full {
            rows.remove(&node);
        }
        rows.is_empty()
    }

    /// `Cycle.try_place` for a task without constraints, no caps, no backfill.
    fn try_place(&mut self, t: usize, entry: &Entry<'py>, key: &Key) -> PyResult<bool> {
        let shape = entry.shape;
        let demand = self.shapes[&shape].demand.clone();
        if self.too_large.iter().any(|floor| demand.iter().zip(floor).all(|(d, f)| d >= f)) {
            self.failed_shapes.insert(shape);
            self.note_blocked(t, entry);
            return Ok(false);
        }
        let Some(node) = self.find_node(shape) else {
            self.failed_shapes.insert(shape);
            self.note_blocked(t, entry);
            if !self.kept_off_reserved_room(shape) {
                self.too_large.retain(|floor| !floor.iter().zip(&demand).all(|(x, d)| x >= d));
                self.too_large.push(demand);
            }
            return Ok(false);
        };
        // `Cycle.commit`
        let nres = self.nres;
        for (r, d) in demand.iter().enumerate() {
            self.free[node * nres + r] -= d;
        }
        if self.room_rows.as_ref().is_some_and(|rows| !rows.is_empty() && rows.contains(&node)) {
            self.room_lost.push(node);
        }
        let row = self.tenants[t].row;
        for (r, d) in demand.iter().enumerate() {
            let added = match &self.charge {
                Some(charge) => charge[row] * d,
                None => *d,
            };
            self.vectors[row * nres + r] += added;
        }
        let within = self.advance(t, entry)?;
        self.placements.push((t, entry.task.clone(), node, key.share, within));
        Ok(true)
    }

    /// `serve_in_order`'s loop: the tenant with the smallest key is served, one task at a time.
    fn serve(&mut self, initial: &[f64], served: &[usize]) -> R<()> {
        let mut heap: BinaryHeap<Reverse<(Key, usize)>> = BinaryHeap::new();
        for &t in served {
            let row = self.tenants[t].row;
            heap.push(Reverse((Key { share: initial[row], arrival: self.arrival[row], name: self.tenants[t].name.clone() }, t)));
        }
        let mut blocked_key: Option<Key> = None;
        while let Some(Reverse((key, t))) = heap.pop() {
            while let Some(entry) = self.next_task(t)? {
                if self.try_place(t, &entry, &key)? {
                    heap.push(Reverse((self.key_of(t), t)));
                    break;
                } else if blocked_key.is_none() && self.blocked.is_some() {
                    blocked_key = Some(key.clone());
                }
                if self.out_of_room() {
                    heap.clear();
                    break;
                }
            }
        }
        if self.reserving {
            self.first_blocked_of_all(initial, blocked_key)?;
        }
        Ok(())
    }

    /// `_first_blocked_of_all`: the first blocked entry a pass over every tenant would find,
    /// among the waiting tenants the pass did not serve (the candidates left them out).
    fn first_blocked_of_all(&mut self, initial: &[f64], blocked_key: Option<Key>) -> R<()> {
        // The waiting tenants not served, found only now: served ones are known by row, and only
        // the left-out tenants whose key comes before the blocked key are kept. With a blocked
        // key, only the rows whose share is not above its share can (their names by row from
        // `names`), not every waiting tenant: none when every share is above it.
        let mut served = vec![false; self.arrival.len()];
        for tenant in &self.tenants {
            served[tenant.row] = true;
        }
        let mut before: Vec<(Key, usize)> = Vec::new(); // (key, row)
        match &blocked_key {
            Some(bk) => {
                for (row, &share) in initial.iter().enumerate() {
                    if served[row] || !(share <= bk.share) {
                        continue;
                    }
                    let name = self.names.get_item(row)?.cast_into::<PyString>().map_err(PyErr::from)?;
                    if !self.pending.contains(&name)? {
                        continue;
                    }
                    let key = Key { share, arrival: self.arrival[row], name };
                    if key < *bk {
                        before.push((key, row));
                    }
                }
            }
            None => {
                for name in self.pending.keys().iter() {
                    let name = name.cast_into::<PyString>().map_err(PyErr::from)?;
                    let row: usize =
                        self.rows.get_item(&name)?.ok_or_else(|| PyKeyError::new_err(name.clone().unbind()))?.extract()?;
                    if !served[row] {
                        before.push((Key { share: initial[row], arrival: self.arrival[row], name }, row));
                    }
                }
            }
        }
        before.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, row) in before {
            self.tenants.push(Tenant { name: key.name, row, groups: None, heads: None });
            let t = self.tenants.len() - 1;
            if let Some(entry) = self.first_short_of_room(t)? {
                self.blocked = Some((t, entry.task));
                return Ok(());
            }
        }
        Ok(())
    }
}

fn rows_of(array: &PyReadonlyArray2<f64>) -> PyResult<(usize, usize, Vec<f64>)> {
    let view = array.as_array();
    let (n, r) = view.dim();
    Ok((n, r, row_major(view).into_owned())) // (one copy, of the pass's own)
}

/// One pass of a flat fair policy (see the module's doc). Arguments, as `serve_in_order`
/// reads them: `pending` (tenant -> PendingQueue), `served` (the tenants the pass serves, in
/// the snapshot's order; None: those of `pending` in `candidates`, a set, or all if that is
/// None too; with `reserving`, the waiting tenants not among them are looked at
/// for the first blocked entry), `rows` (tenant -> row), `names` (row -> tenant), `free`
/// (node x resource), `vectors` (row x resource: what the key measures), `charge` (per row, or
/// None: a placement adds the demand), `extra` (per row,
/// added to the share, or None), `initial` (per row: the keys' first shares; None: made from
/// the vectors, as `FlatKey.initial_shares`), `resource`
/// (None: the dominant share), the grown rows, fresh shapes and grown demands of a pass over
/// candidates, the reservation (node, shape). Returns None when the pass meets a task this
/// pass does not handle, else `(placements, blocked)`: placements `(tenant, entry, node, share
/// of the key it was served with, tasks of the entry taken before it in this pass, count)` in
/// order, `count` > 1 for a run of the entry's next tasks placed one after another on one node,
/// blocked `(tenant, entry)` or None. Tenant names are the caller's string objects.
#[pyfunction]
#[pyo3(signature = (pending, pending_state, eps, served, candidates, rows, names, free, capacity, vectors, charge, extra,
                    fraction, arrival, initial, resource, grown, fresh, grown_demands, reservation, reserving))]
#[allow(clippy::too_many_arguments)]
fn serve_flat<'py>(
    py: Python<'py>,
    pending: &Bound<'py, PyDict>,
    pending_state: &Bound<'py, PyAny>,
    eps: f64,
    served: Option<Vec<Bound<'py, PyString>>>,
    candidates: Option<Bound<'py, PyAny>>,
    rows: &Bound<'py, PyDict>,
    names: &Bound<'py, PyList>,
    free: PyReadonlyArray2<'py, f64>,
    capacity: PyReadonlyArray1<'py, f64>,
    vectors: PyReadonlyArray2<'py, f64>,
    charge: Option<PyReadonlyArray1<'py, f64>>,
    extra: Option<PyReadonlyArray1<'py, f64>>,
    fraction: PyReadonlyArray1<'py, f64>,
    arrival: PyReadonlyArray1<'py, f64>,
    initial: Option<PyReadonlyArray1<'py, f64>>,
    resource: Option<usize>,
    grown: Option<PyReadonlyArray1<'py, i64>>,
    fresh: Vec<i64>,
    grown_demands: Option<PyReadonlyArray2<'py, f64>>,
    reservation: Option<(usize, i64)>,
    reserving: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let (nnodes, nres, free) = rows_of(&free)?;
    let (_, _, vectors) = rows_of(&vectors)?;
    let grown: Option<Vec<usize>> = grown.map(|g| g.as_array().iter().map(|&n| n as usize).collect());
    let grown_demands: Option<Vec<Vec<f64>>> =
        grown_demands.map(|d| d.as_array().rows().into_iter().map(|row| row.to_vec()).collect());
    let mut pass = Pass {
        pending: pending.clone(),
        rows: rows.clone(),
        names: names.clone(),
        pending_state: pending_state.clone(),
        eps,
        nres,
        nnodes,
        free,
        capacity: capacity.as_array().to_vec(),
        resource,
        vectors,
        charge: charge.map(|c| c.as_array().to_vec()),
        extra: extra.map(|e| e.as_array().to_vec()),
        fraction: fraction.as_array().to_vec(),
        arrival: arrival.as_array().to_vec(),
        tenants: Vec::new(),
        groups: FxMap::default(),
        cursor: FxMap::default(),
        shapes: FxMap::default(),
        candidates: FxMap::default(),
        failed_shapes: FxSet::default(),
        too_large: Vec::new(),
        fresh: fresh.into_iter().collect(),
        room_rows: None,
        room_lost: Vec::new(),
        grown,
        grown_demands,
        reservation,
        reserving,
        blocked: None,
        placements: Vec::new(),
    };
    // `Cycle.__init__`: in a pass over candidates with no new shape, the grown rows watched
    if pass.grown_demands.is_some() && pass.fresh.is_empty() {
        if let Some(grown) = &pass.grown {
            let watched: FxSet<usize> = grown.iter().copied().filter(|&n| pass.room_for_any(n)).collect();
            pass.room_rows = Some(watched);
        }
    }
    let served: Vec<Bound<'py, PyString>> = match served {
        Some(served) => served,
        None => {
            // `serve_in_order`'s default: the waiting tenants that are candidates (all without).
            // In the candidates' own order, which is usually far the smaller set: the order of
            // service is the keys' (share, arrival, name: no two tenants tie), not this one's.
            let mut chosen = Vec::new();
            match &candidates {
                Some(set) => {
                    for name in set.try_iter()? {
                        let name = name?;
                        if pending.contains(&name)? {
                            chosen.push(name.cast_into::<PyString>().map_err(PyErr::from)?);
                        }
                    }
                }
                None => {
                    for name in pending.keys().iter() {
                        chosen.push(name.cast_into::<PyString>().map_err(PyErr::from)?);
                    }
                }
            }
            chosen
        }
    };
    let served: Vec<usize> = served.into_iter().map(|name| pass.add_tenant(name)).collect::<PyResult<_>>()?;
    let initial: Vec<f64> = match initial {
        Some(initial) => initial.as_array().to_vec(),
        None => (0..pass.fraction.len()).map(|row| pass.share_of(row)).collect(),
    };
    match pass.serve(&initial, &served) {
        Err(Stop::Unsupported) => return Ok(None),
        Err(Stop::Error(err)) => return Err(err),
        Ok(()) => {}
    }
    // A placement that continues the one before it (the same entry's next task, on the same
    // node) joins it: the caller records such a run as one decision of `count` tasks.
    let placements = PyList::empty(py);
    let mut run: Option<(usize, Bound<'py, PyAny>, usize, f64, i64, i64)> = None;
    for (t, task, node, share, within) in pass.placements {
        if let Some(open) = run.as_mut() {
            if open.1.is(&task) && open.2 == node {
                open.5 += 1;
                continue;
            }
        }
        if let Some((t, task, node, share, within, count)) = run.replace((t, task, node, share, within, 1)) {
            placements.append((pass.tenants[t].name.clone(), task, node, share, within, count))?;
        }
    }
    if let Some((t, task, node, share, within, count)) = run {
        placements.append((pass.tenants[t].name.clone(), task, node, share, within, count))?;
    }
    let blocked = match pass.blocked {
        Some((t, task)) => (pass.tenants[t].name.clone(), task).into_pyobject(py)?.into_any(),
        None => py.None().into_bound(py),
    };
    Ok(Some(PyTuple::new(py, [placements.into_any(), blocked])?))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve_flat, m)?)?;
    m.add_function(wrap_pyfunction!(shapes_that_fit, m)?)?;
    m.add_function(wrap_pyfunction!(least_lacking_node, m)?)?;
    m.add_function(wrap_pyfunction!(room_for_some, m)?)?;
    m.add_function(wrap_pyfunction!(metric_state, m)?)?;
    m.add_function(wrap_pyfunction!(accumulate_usage, m)?)?;
    m.add_function(wrap_pyfunction!(integrate_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(advance_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(top_ups, m)?)?;
    m.add_function(wrap_pyfunction!(rows_due, m)?)?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Per-event arithmetic of the engine and the simulator, each the twin of one numpy function.

/// `Accounting.top_ups` of every row with nothing discounted (formula 15): per element of the
/// row x resource arrays, `max((quanta[row] - now) * demand + weighted, 0)` as numpy makes it
/// (`np.maximum(x, 0.0)`: NaN stays, -0.0 becomes 0.0), in a new array.
#[pyfunction]
fn top_ups<'py>(
    py: Python<'py>,
    quanta: PyReadonlyArray1<'py, f64>,
    demand: PyReadonlyArray2<'py, f64>,
    weighted: PyReadonlyArray2<'py, f64>,
    now: f64,
) -> PyResult<Bound<'py, numpy::PyArray2<f64>>> {
    let (quanta, demand, weighted) = (quanta.as_array(), demand.as_array(), weighted.as_array());
    let (rows, nres) = demand.dim();
    if quanta.len() != rows || weighted.dim() != (rows, nres) {
        return Err(pyo3::exceptions::PyValueError::new_err("top_ups: arrays of different shapes"));
    }
    let mut out = Vec::with_capacity(rows * nres);
    for row in 0..rows {
        let left = quanta[row] - now;
        for k in 0..nres {
            let extra = left * demand[[row, k]] + weighted[[row, k]];
            out.push(if extra > 0.0 || extra.is_nan() { extra } else { 0.0 });
        }
    }
    numpy::ndarray::Array2::from_shape_vec((rows, nres), out)
        .map(|array| numpy::PyArray2::from_owned_array(py, array))
        .map_err(|err| pyo3::exceptions::PyValueError::new_err(err.to_string()))
}

/// The rows whose `due` time is not after `now` (`np.flatnonzero(due <= now)`), in order.
#[pyfunction]
fn rows_due(due: PyReadonlyArray1<'_, f64>, now: f64) -> Vec<usize> {
    due.as_array().iter().enumerate().filter(|(_, &at)| at <= now).map(|(row, _)| row).collect()
}

/// `Accounting.advance` without decay, in place: per element of the row x resource arrays,
/// `counted += elapsed * (min(used, share) + discount * max(used - share, 0))` (formula 7's
/// counted allocation, `fairness.counted_allocation`) and `raw += elapsed * used`, the same
/// float operations in the same order as the numpy.
#[pyfunction]
fn accumulate_usage(
    used: PyReadonlyArray2<'_, f64>,
    share: PyReadonlyArray2<'_, f64>,
    discount: f64,
    elapsed: f64,
    mut counted: PyReadwriteArray2<'_, f64>,
    mut raw: PyReadwriteArray2<'_, f64>,
) -> PyResult<()> {
    let (used, share) = (used.as_array(), share.as_array());
    let (mut counted, mut raw) = (counted.as_array_mut(), raw.as_array_mut());
    if used.dim() != share.dim() || used.dim() != counted.dim() || used.dim() != raw.dim() {
        return Err(pyo3::exceptions::PyValueError::new_err("accumulate_usage: arrays of different shapes"));
    }
    // (by offset in the usual contiguous arrays: indexing the 2-D views element by element cost
    // about 90 instructions an element)
    if let (Some(used), Some(share), Some(counted), Some(raw)) =
        (used.as_slice(), share.as_slice(), counted.as_slice_mut(), raw.as_slice_mut())
    {
        for (((counted_total, raw_total), &a), &s) in counted.iter_mut().zip(raw.iter_mut()).zip(used).zip(share) {
            *counted_total += elapsed * counted_of(a, s, discount);
            *raw_total += elapsed * a;
        }
        return Ok(());
    }
    for ((index, &a), &s) in used.indexed_iter().zip(share.iter()) {
        counted[index] += elapsed * counted_of(a, s, discount);
        raw[index] += elapsed * a;
    }
    Ok(())
}

/// `MetricsRecorder.advance`'s integrals over an interval `dt` of constant state, in place, the
/// same float operations as its numpy: per tenant row `integrals[0] += dt * g`,
/// `integrals[1] += dt * minimum(d, entitled)` (numpy's minimum: the first unless the second is
/// smaller), `integrals[2] += dt * counted`; per resource `busy += dt * running` and
/// `capacity_integral += dt * capacity`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn integrate_metrics(
    mut integrals: PyReadwriteArray2<'_, f64>,
    g: PyReadonlyArray1<'_, f64>,
    d: PyReadonlyArray1<'_, f64>,
    entitled: PyReadonlyArray1<'_, f64>,
    counted: PyReadonlyArray1<'_, f64>,
    dt: f64,
    mut busy: PyReadwriteArray1<'_, f64>,
    running: PyReadonlyArray1<'_, f64>,
    mut capacity_integral: PyReadwriteArray1<'_, f64>,
    capacity: PyReadonlyArray1<'_, f64>,
) -> PyResult<()> {
    let (g, d, entitled, counted) = (g.as_array(), d.as_array(), entitled.as_array(), counted.as_array());
    let mut integrals = integrals.as_array_mut();
    let n = g.len();
    if integrals.nrows() != 3 || integrals.ncols() != n || d.len() != n || entitled.len() != n || counted.len() != n {
        return Err(pyo3::exceptions::PyValueError::new_err("integrate_metrics: arrays of different lengths"));
    }
    for i in 0..n {
        let mut integral = integrals.column_mut(i);
        integrate_row(&mut integral, dt, g[i], d[i], entitled[i], counted[i]);
    }
    let running: Vec<f64> = running.as_array().to_vec();
    let capacity: Vec<f64> = capacity.as_array().to_vec();
    integrate_totals("integrate_metrics", &mut busy.as_array_mut(), &running, &mut capacity_integral.as_array_mut(), &capacity, dt)
}

/// `Changes.candidates`' scan: of `shapes` (the keys of the waiting shapes' holders, rows of
/// `shape_demands`), those whose demand fits the free room `capacity - used + eps` of some row
/// in `rows`, in the order given, and their demands (`shape_demands[those]`, a new array).
#[pyfunction]
fn shapes_that_fit<'py>(
    py: Python<'py>,
    shapes: &Bound<'py, PyDict>,
    shape_demands: PyReadonlyArray2<'py, f64>,
    capacity: PyReadonlyArray2<'py, f64>,
    used: PyReadonlyArray2<'py, f64>,
    rows: PyReadonlyArray1<'py, i64>,
    eps: f64,
) -> PyResult<(Vec<usize>, Bound<'py, numpy::PyArray2<f64>>)> {
    let (demands, capacity, used) = (shape_demands.as_array(), capacity.as_array(), used.as_array());
    let nres = demands.ncols();
    let free: Vec<Vec<f64>> = rows
        .as_array()
        .iter()
        .map(|&row| (0..nres).map(|k| capacity[[row as usize, k]] - used[[row as usize, k]] + eps).collect())
        .collect();
    let mut fitting = Vec::new();
    let mut fitting_demands = Vec::new();
    for shape in shapes.keys().iter() {
        let shape: usize = shape.extract()?;
        if free.iter().any(|room| (0..nres).all(|k| demands[[shape, k]] <= room[k])) {
            fitting.push(shape);
            fitting_demands.extend((0..nres).map(|k| demands[[shape, k]]));
        }
    }
    let found = numpy::ndarray::Array2::from_shape_vec((fitting.len(), nres), fitting_demands)
        .map_err(|err| pyo3::exceptions::PyValueError::new_err(err.to_string()))?;
    Ok((fitting, numpy::PyArray2::from_owned_array(py, found)))
}

/// `Nodes.room_for_some`'s scan: whether some row of `demands` fits the free room
/// `capacity - used + eps` of one node (its rows of the two arrays).
#[pyfunction]
fn room_for_some(demands: PyReadonlyArray2<'_, f64>, capacity: PyReadonlyArray1<'_, f64>, used: PyReadonlyArray1<'_, f64>,
                 eps: f64) -> bool {
    let (demands, capacity, used) = (demands.as_array(), capacity.as_array(), used.as_array());
    let room: Vec<f64> = capacity.iter().zip(used.iter()).map(|(c, u)| c - u + eps).collect();
    demands.rows().into_iter().any(|demand| demand.iter().zip(&room).all(|(d, r)| d <= r))
}

/// `Engine._reserve`'s choice: among live nodes (`usable`) whose capacity holds `demand`
/// (`capacity >= demand - eps`), the one that lacks least, summed over resources as shares of
/// `total` (a total not above 0, or NaN, counts as 1: `np.where(total > 0, total, 1.0)`); the
/// lowest row on ties. None if there is none.
#[pyfunction]
fn least_lacking_node(
    usable: PyReadonlyArray1<'_, bool>,
    capacity: PyReadonlyArray2<'_, f64>,
    used: PyReadonlyArray2<'_, f64>,
    demand: PyReadonlyArray1<'_, f64>,
    total: PyReadonlyArray1<'_, f64>,
    eps: f64,
) -> Option<usize> {
    let (usable, capacity, used) = (usable.as_array(), capacity.as_array(), used.as_array());
    let (demand, total) = (demand.as_array(), total.as_array());
    let nres = demand.len();
    let total: Vec<f64> = total.iter().map(|&t| if t > 0.0 { t } else { 1.0 }).collect();
    let mut best: Option<(f64, usize)> = None;
    for row in 0..usable.len() {
        if !usable[row] || !(0..nres).all(|k| capacity[[row, k]] >= demand[k] - eps) {
            continue;
        }
        let mut lacking = 0.0;
        for k in 0..nres {
            lacking += f64::max(demand[k] - (capacity[[row, k]] - used[[row, k]]), 0.0) / total[k];
        }
        // (numpy's argmin: the first of the smallest; a NaN is the smallest)
        if best.is_none_or(|(least, _)| lacking < least || (lacking.is_nan() && !least.is_nan())) {
            best = Some((lacking, row));
        }
    }
    best.map(|(_, row)| row)
}

/// Formula 7's counted allocation of one resource, `fairness.counted_allocation`:
/// `min(used, share) + discount * max(used - share, 0)`.
fn counted_of(used: f64, share: f64, discount: f64) -> f64 {
    f64::min(used, share) + discount * f64::max(used - share, 0.0)
}

/// `fairness.resource_share` of one row: one resource's share (`resource`), or the dominant
/// share (`dominant_share`: the largest used / total over resources with capacity; 0 if none).
fn share_of_row(row: &[f64], capacity: &[f64], resource: Option<usize>) -> f64 {
    match resource {
        None => {
            let mut best: Option<f64> = None;
            for (used, total) in row.iter().zip(capacity) {
                if *total > 0.0 {
                    let s = used / total;
                    if best.is_none_or(|b| s > b) {
                        best = Some(s);
                    }
                }
            }
            best.unwrap_or(0.0)
        }
        Some(r) => {
            if capacity[r] > 0.0 {
                row[r] / capacity[r]
            } else {
                0.0
            }
        }
    }
}

/// The metric state of the first `n` tenant rows, a row at a time (`MetricsRecorder._state`):
/// what each row runs, wants and counts (formula 7), read from the accounting's arrays.
struct MetricRows<'a> {
    // Row-major and contiguous (borrowed as they are, the usual case; copied if not): a row's
    // values read by offset. Indexing the 2-D views element by element cost about 240
    // instructions a tenant row, most of this call.
    allocation: Cow<'a, [f64]>,
    share: Cow<'a, [f64]>,
    pending: Cow<'a, [f64]>,
    capacity: Vec<f64>,
    discount: f64,
    resource: Option<usize>,
    used: Vec<f64>, // (one buffer per quantity for every row: a row's own vectors cost a fifth of the call)
    wanted: Vec<f64>,
    kept: Vec<f64>,
}

/// A 2-D array's values in row-major order: borrowed if contiguous, else copied.
fn row_major<'a>(view: numpy::ndarray::ArrayView2<'a, f64>) -> Cow<'a, [f64]> {
    match view.to_slice() {
        Some(values) => Cow::Borrowed(values),
        None => Cow::Owned(view.iter().copied().collect()),
    }
}

impl MetricRows<'_> {
    /// Row `row`'s (g, d, counted g'): shares of the metric resource (or dominant shares).
    fn row(&mut self, row: usize) -> (f64, f64, f64) {
        let nres = self.capacity.len();
        let at = row * nres;
        for k in 0..nres {
            self.used[k] = self.allocation[at + k];
            self.wanted[k] = self.used[k] + self.pending[at + k];
            self.kept[k] = counted_of(self.used[k], self.share[at + k], self.discount);
        }
        (
            share_of_row(&self.used, &self.capacity, self.resource),
            share_of_row(&self.wanted, &self.capacity, self.resource),
            share_of_row(&self.kept, &self.capacity, self.resource),
        )
    }

    /// What runs, per resource, summed over every row in row order (`allocation.sum(axis=0)`).
    fn running(&self) -> Vec<f64> {
        let nres = self.capacity.len();
        let mut running = vec![0.0; nres];
        for row in self.allocation.chunks_exact(nres.max(1)) {
            for (total, used) in running.iter_mut().zip(row) {
                *total += used;
            }
        }
        running
    }

    /// Formula 12's soft fairness degree over the rows with something pending (every row; 0
    /// with fewer than two, or fewer than `n` = 2 tenants).
    fn soft_degree(&mut self, n: usize, fractions: &numpy::ndarray::ArrayView1<f64>) -> f64 {
        if n < 2 {
            return 0.0;
        }
        let nres = self.capacity.len();
        let (mut most, mut least, mut weighted, mut active) = (f64::NEG_INFINITY, f64::INFINITY, 0, 0);
        for row in 0..self.pending.len() / nres.max(1) {
            let at = row * nres;
            let wants: f64 = self.pending[at..at + nres].iter().fold(0.0, |sum, x| sum + x);
            if wants > 0.0 {
                active += 1;
                if fractions[row] > 0.0 {
                    self.used.copy_from_slice(&self.allocation[at..at + nres]);
                    let share = share_of_row(&self.used, &self.capacity, None) / fractions[row];
                    most = f64::max(most, share);
                    least = f64::min(least, share);
                    weighted += 1;
                }
            }
        }
        if active >= 2 && weighted >= 2 { most - least } else { 0.0 }
    }
}

fn metric_rows<'a>(
    allocation: &'a PyReadonlyArray2<'_, f64>,
    share: &'a PyReadonlyArray2<'_, f64>,
    pending: &'a PyReadonlyArray2<'_, f64>,
    capacity: &PyReadonlyArray1<'_, f64>,
    discount: f64,
    resource: Option<usize>,
) -> PyResult<MetricRows<'a>> {
    let capacity = capacity.as_array().to_vec();
    let nres = capacity.len();
    let (allocation, share, pending) = (allocation.as_array(), share.as_array(), pending.as_array());
    if allocation.ncols() != nres || share.ncols() != nres || pending.ncols() != nres {
        return Err(pyo3::exceptions::PyValueError::new_err("metric arrays of different widths"));
    }
    Ok(MetricRows {
        allocation: row_major(allocation),
        share: row_major(share),
        pending: row_major(pending),
        capacity,
        discount,
        resource,
        used: vec![0.0; nres],
        wanted: vec![0.0; nres],
        kept: vec![0.0; nres],
    })
}

/// `MetricsRecorder._state` and `soft_fairness` in one: per tenant row (the first `n`), g, d
/// and the counted allocation's share (formula 7) in the metric `resource`; and formula 12's
/// soft fairness degree over the tenants with something pending (every row); and what runs, per
/// resource, summed over every row in row order (`allocation.sum(axis=0)`, the busy-time integral's).
#[pyfunction]
#[pyo3(signature = (n, allocation, share, pending, capacity, fractions, discount, resource))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn metric_state<'py>(
    py: Python<'py>,
    n: usize,
    allocation: PyReadonlyArray2<'py, f64>,
    share: PyReadonlyArray2<'py, f64>,
    pending: PyReadonlyArray2<'py, f64>,
    capacity: PyReadonlyArray1<'py, f64>,
    fractions: PyReadonlyArray1<'py, f64>,
    discount: f64,
    resource: Option<usize>,
) -> PyResult<(Bound<'py, numpy::PyArray1<f64>>, Bound<'py, numpy::PyArray1<f64>>, Bound<'py, numpy::PyArray1<f64>>, f64, Bound<'py, numpy::PyArray1<f64>>)> {
    let mut rows = metric_rows(&allocation, &share, &pending, &capacity, discount, resource)?;
    let (mut g, mut d, mut counted) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for row in 0..n {
        let (held, wanted, kept) = rows.row(row);
        g.push(held);
        d.push(wanted);
        counted.push(kept);
    }
    let degree = rows.soft_degree(n, &fractions.as_array());
    Ok((
        numpy::PyArray1::from_vec(py, g),
        numpy::PyArray1::from_vec(py, d),
        numpy::PyArray1::from_vec(py, counted),
        degree,
        numpy::PyArray1::from_vec(py, rows.running()),
    ))
}

/// `metric_state` then `integrate_metrics` over `dt`, in one call and without the state's
/// arrays, for the simulator's steps that neither sample nor watch a tenant reach its fair
/// share (most of them): the same float operations in the same order. Returns the soft
/// fairness degree.
#[pyfunction]
#[pyo3(signature = (n, allocation, share, pending, capacity, fractions, discount, resource, entitled, dt,
                    integrals, busy, capacity_integral))]
#[allow(clippy::too_many_arguments)]
fn advance_metrics(
    n: usize,
    allocation: PyReadonlyArray2<'_, f64>,
    share: PyReadonlyArray2<'_, f64>,
    pending: PyReadonlyArray2<'_, f64>,
    capacity: PyReadonlyArray1<'_, f64>,
    fractions: PyReadonlyArray1<'_, f64>,
    discount: f64,
    resource: Option<usize>,
    entitled: PyReadonlyArray1<'_, f64>,
    dt: f64,
    mut integrals: PyReadwriteArray2<'_, f64>,
    mut busy: PyReadwriteArray1<'_, f64>,
    mut capacity_integral: PyReadwriteArray1<'_, f64>,
) -> PyResult<f64> {
    let mut rows = metric_rows(&allocation, &share, &pending, &capacity, discount, resource)?;
    let (entitled, mut integrals) = (entitled.as_array(), integrals.as_array_mut());
    if integrals.nrows() != 3 || integrals.ncols() != n || entitled.len() != n {
        return Err(pyo3::exceptions::PyValueError::new_err("advance_metrics: arrays of different lengths"));
    }
    for i in 0..n {
        let (g, d, counted) = rows.row(i);
        let mut integral = integrals.column_mut(i);
        integrate_row(&mut integral, dt, g, d, entitled[i], counted);
    }
    let running = rows.running();
    integrate_totals("advance_metrics", &mut busy.as_array_mut(), &running, &mut capacity_integral.as_array_mut(), &rows.capacity, dt)?;
    Ok(rows.soft_degree(n, &fractions.as_array()))
}

/// One tenant row's integrals over `dt` (`integrals[:, row]`): `g`, numpy's `minimum(d,
/// entitled)` (the first unless the second is smaller) and the counted `g'`.
fn integrate_row(integral: &mut numpy::ndarray::ArrayViewMut1<f64>, dt: f64, g: f64, d: f64, entitled: f64, counted: f64) {
    let least = if d <= entitled || d.is_nan() { d } else { entitled };
    integral[0] += dt * g;
    integral[1] += dt * least;
    integral[2] += dt * counted;
}

/// `busy += dt * running` and `capacity_integral += dt * capacity`, per resource; `caller`
/// names the function in a length error.
fn integrate_totals(caller: &str, busy: &mut numpy::ndarray::ArrayViewMut1<f64>, running: &[f64], capacity_integral: &mut numpy::ndarray::ArrayViewMut1<f64>,
                    capacity: &[f64], dt: f64) -> PyResult<()> {
    if busy.len() != running.len() || capacity_integral.len() != capacity.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!("{caller}: arrays of different lengths")));
    }
    for (total, used) in busy.iter_mut().zip(running) {
        *total += dt * used;
    }
    for (total, room) in capacity_integral.iter_mut().zip(capacity) {
        *total += dt * room;
    }
    Ok(())
}
