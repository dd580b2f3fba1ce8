//! Programmatic dependent launch inside recorded steps. Stream capture makes each captured
//! operation depend on the one before it, and turns a dependent launch into a programmatic
//! edge only between two kernels adjacent in that chain: behind an allocation, a free, a copy
//! or a memset node, a kernel waits for the whole kernel before it, as if launched without PDL.
//! Stream-ordered allocations made while recording did exactly that (H100, batch-1 decode:
//! eager steps 951 tokens/s, replayed graphs 851), so recordings now take their buffers from a
//! pool allocated outside the capture (`CudaDevice::alloc_buf`).
//!
//! [`relink`] counts what a captured graph holds (for `LATTICE_CUDA_TRACE`) and, where it has
//! no memory nodes (the driver refuses to remove edges of graphs that have them), makes every
//! edge between two kernels whose later one was launched as a dependent programmatic, and
//! gives every other node the nearest nodes before it as full dependencies. Kernels launched
//! otherwise (cuBLAS) keep full edges; the order between nodes is the captured one.

use std::collections::{HashMap, HashSet};

use cudarc::driver::sys;

/// What a recorded step holds, before and after [`relink`] (for `LATTICE_CUDA_TRACE`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Shape {
    pub kernels: usize,
    /// Kernels launched as programmatic dependents.
    pub dependents: usize,
    pub allocations: usize,
    /// Bytes of the allocation nodes.
    pub allocated: usize,
    pub frees: usize,
    /// Other nodes (copies, memsets).
    pub others: usize,
    pub edges: usize,
    /// Programmatic edges as captured.
    pub programmatic_captured: usize,
    /// Programmatic edges after relinking.
    pub programmatic: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Kernel { dependent: bool },
    Alloc,
    Free,
    Other,
}

fn check(r: sys::CUresult, what: &str) -> Result<(), String> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!("{what}: {e:?}")),
    }
}

const DEFAULT_EDGE: sys::CUgraphEdgeData = sys::CUgraphEdgeData {
    from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_DEFAULT as u8,
    to_port: 0,
    type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8,
    reserved: [0; 5],
};

const PROGRAMMATIC_EDGE: sys::CUgraphEdgeData = sys::CUgraphEdgeData {
    from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
    to_port: 0,
    type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
    reserved: [0; 5],
};

fn is_programmatic(e: &sys::CUgraphEdgeData) -> bool {
    e.type_ == PROGRAMMATIC_EDGE.type_
}

/// Counts `graph`'s nodes and edges and, with `apply` and no memory nodes, rewrites its
/// dependencies as the module comment says; `dependents` holds the functions (CUfunction
/// addresses) that were launched as programmatic dependents.
///
/// # Safety
/// `graph` must be a valid graph that no other thread uses, not yet instantiated.
pub(super) unsafe fn relink(
    graph: sys::CUgraph,
    dependents: &HashSet<usize>,
    apply: bool,
) -> Result<Shape, String> {
    // SAFETY (every call below): `graph` is valid (the caller's guarantee) and the output
    // arrays are sized by the count the first call of each pair returned.
    let mut n = 0usize;
    check(
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) },
        "listing nodes",
    )?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    check(
        unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) },
        "listing nodes",
    )?;
    nodes.truncate(n);
    let index: HashMap<usize, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, &p)| (p as usize, i))
        .collect();
    let mut shape = Shape::default();
    let mut kinds = Vec::with_capacity(n);
    for &node in &nodes {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(
            unsafe { sys::cuGraphNodeGetType(node, &mut t) },
            "a node's type",
        )?;
        let kind = match t {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                check(
                    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut p) },
                    "a kernel node",
                )?;
                let dependent = dependents.contains(&(p.func as usize));
                shape.kernels += 1;
                shape.dependents += usize::from(dependent);
                Kind::Kernel { dependent }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                check(
                    unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut p) },
                    "an allocation node",
                )?;
                shape.allocations += 1;
                shape.allocated += p.bytesize;
                Kind::Alloc
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                shape.frees += 1;
                Kind::Free
            }
            _ => {
                shape.others += 1;
                Kind::Other
            }
        };
        kinds.push(kind);
    }
    let mut m = 0usize;
    check(
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut m,
            )
        },
        "listing edges",
    )?;
    let mut from = vec![std::ptr::null_mut(); m];
    let mut to = vec![std::ptr::null_mut(); m];
    let mut data = vec![DEFAULT_EDGE; m];
    check(
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut m,
            )
        },
        "listing edges",
    )?;
    for v in [&mut from, &mut to] {
        v.truncate(m);
    }
    data.truncate(m);
    shape.edges = m;
    shape.programmatic_captured = data.iter().filter(|e| is_programmatic(e)).count();
    let node_of = |p: sys::CUgraphNode| -> Result<usize, String> {
        index
            .get(&(p as usize))
            .copied()
            .ok_or_else(|| "an edge names an unlisted node".to_string())
    };
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (&f, &t) in from.iter().zip(&to) {
        preds[node_of(t)?].push(node_of(f)?);
    }
    // The new edges: allocation nodes keep none; every other node takes its direct
    // allocation predecessors (roots now) and the nearest predecessors that are neither
    // allocations nor frees.
    let mut new_edges: Vec<(usize, usize, sys::CUgraphEdgeData)> = Vec::with_capacity(m);
    for t in 0..n {
        if kinds[t] == Kind::Alloc {
            continue;
        }
        let mut seen = HashSet::new();
        let mut stack = preds[t].clone();
        while let Some(p) = stack.pop() {
            if !seen.insert(p) {
                continue;
            }
            match kinds[p] {
                Kind::Alloc | Kind::Free => {
                    if kinds[p] == Kind::Alloc && preds[t].contains(&p) {
                        new_edges.push((p, t, DEFAULT_EDGE));
                    }
                    stack.extend_from_slice(&preds[p]);
                }
                Kind::Kernel { .. } if kinds[t] == (Kind::Kernel { dependent: true }) => {
                    new_edges.push((p, t, PROGRAMMATIC_EDGE));
                }
                _ => new_edges.push((p, t, DEFAULT_EDGE)),
            }
        }
    }
    shape.programmatic = new_edges.iter().filter(|e| is_programmatic(&e.2)).count();
    if !apply || shape.allocations + shape.frees > 0 {
        shape.programmatic = shape.programmatic_captured;
        return Ok(shape);
    }
    check(
        unsafe {
            sys::cuGraphRemoveDependencies_v2(graph, from.as_ptr(), to.as_ptr(), data.as_ptr(), m)
        },
        "removing the captured edges",
    )?;
    let nf: Vec<sys::CUgraphNode> = new_edges.iter().map(|e| nodes[e.0]).collect();
    let nt: Vec<sys::CUgraphNode> = new_edges.iter().map(|e| nodes[e.1]).collect();
    let nd: Vec<sys::CUgraphEdgeData> = new_edges.iter().map(|e| e.2).collect();
    check(
        unsafe {
            sys::cuGraphAddDependencies_v2(graph, nf.as_ptr(), nt.as_ptr(), nd.as_ptr(), nf.len())
        },
        "adding the relinked edges",
    )?;
    Ok(shape)
}
