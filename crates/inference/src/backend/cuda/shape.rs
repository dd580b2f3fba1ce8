//! What a recorded step holds: its kernels, memory nodes and programmatic edges. Stream
//! capture makes each captured operation depend on the one before it and turns a dependent
//! launch into a programmatic edge only between two adjacent kernels: behind an allocation, a
//! free, a copy or a memset node, a kernel waits for the whole kernel before it, as if launched
//! without PDL. Stream-ordered allocations made while recording did exactly that (H100,
//! batch-1 decode: eager steps 951 tokens/s, replayed graphs 851), so recordings now take their
//! buffers from a pool allocated outside the capture (`CudaDevice::alloc_buf`), and [`count`]
//! tells whether a recording still has nodes between its kernels (`LATTICE_CUDA_TRACE`,
//! [`super::CudaDevice::last_recording`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use cudarc::driver::sys;

/// What a recorded step holds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Shape {
    /// Kernel nodes.
    pub kernels: usize,
    /// Kernels launched as programmatic dependents.
    pub dependents: usize,
    /// Allocation nodes.
    pub allocations: usize,
    /// Bytes of the allocation nodes.
    pub allocated: usize,
    /// Free nodes.
    pub frees: usize,
    /// Other nodes (copies, memsets).
    pub others: usize,
    /// Edges.
    pub edges: usize,
    /// Programmatic edges.
    pub programmatic: usize,
    /// Full (not programmatic) edges from a kernel into a kernel launched as a dependent: the
    /// later kernel waits for the whole earlier one though it could start early.
    pub full_into_dependents: usize,
}

fn check(r: sys::CUresult, what: &str) -> Result<(), String> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!("{what}: {e:?}")),
    }
}

/// Counts `graph`'s nodes and edges; `dependents` holds the functions (CUfunction addresses)
/// that were launched as programmatic dependents. With `name`, also how many full edges into
/// dependents join each "earlier kernel -> later kernel" pair (function names, for
/// `LATTICE_CUDA_TRACE`).
///
/// # Safety
/// `graph` must be a valid graph that no other thread uses.
pub(super) unsafe fn count(
    graph: sys::CUgraph,
    dependents: &HashSet<usize>,
    name: bool,
) -> Result<(Shape, BTreeMap<String, usize>), String> {
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
    let mut shape = Shape::default();
    // The function of every kernel node.
    let mut funcs: HashMap<usize, sys::CUfunction> = HashMap::new();
    for &node in &nodes {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(
            unsafe { sys::cuGraphNodeGetType(node, &mut t) },
            "a node's type",
        )?;
        match t {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                let p = unsafe {
                    node_params(node, sys::cuGraphKernelNodeGetParams_v2, "a kernel node")
                }?;
                shape.kernels += 1;
                shape.dependents += usize::from(dependents.contains(&(p.func as usize)));
                funcs.insert(node as usize, p.func);
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let p = unsafe {
                    node_params(
                        node,
                        sys::cuGraphMemAllocNodeGetParams,
                        "an allocation node",
                    )
                }?;
                shape.allocations += 1;
                shape.allocated += p.bytesize;
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => shape.frees += 1,
            _ => shape.others += 1,
        }
    }
    let mut m = 0usize;
    let none = std::ptr::null_mut();
    check(
        unsafe { sys::cuGraphGetEdges_v2(graph, none, none, std::ptr::null_mut(), &mut m) },
        "listing edges",
    )?;
    let mut from = vec![std::ptr::null_mut(); m];
    let mut to = vec![std::ptr::null_mut(); m];
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; m];
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
    data.truncate(m);
    shape.edges = m;
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    shape.programmatic = data.iter().filter(|e| e.type_ == programmatic).count();
    let mut full = BTreeMap::new();
    for ((f, t), e) in from.iter().zip(&to).zip(&data) {
        let (Some(&ff), Some(&tf)) = (funcs.get(&(*f as usize)), funcs.get(&(*t as usize))) else {
            continue;
        };
        if e.type_ != programmatic && dependents.contains(&(tf as usize)) {
            shape.full_into_dependents += 1;
            if name {
                // SAFETY: both are functions of kernel nodes of the valid graph.
                let pair = format!("{} -> {}", unsafe { func_name(ff) }, unsafe {
                    func_name(tf)
                });
                *full.entry(pair).or_default() += 1;
            }
        }
    }
    Ok((shape, full))
}

/// A node's parameters, read by `get` (the driver call for the node's type).
///
/// # Safety
/// `node` must be a valid node of the type `get` reads; `P` a plain C struct (all zeros valid).
unsafe fn node_params<P>(
    node: sys::CUgraphNode,
    get: unsafe fn(sys::CUgraphNode, *mut P) -> sys::CUresult,
    what: &str,
) -> Result<P, String> {
    // SAFETY: `P` is a C struct of integers and pointers, for which all zeros is a value.
    let mut p: P = unsafe { std::mem::zeroed() };
    // SAFETY: `node` is valid and of `get`'s type (the caller's guarantee); `p` is writable.
    check(unsafe { get(node, &mut p) }, what)?;
    Ok(p)
}

/// A function's name ("?" where the driver gives none).
///
/// # Safety
/// `f` must be a valid function handle.
unsafe fn func_name(f: sys::CUfunction) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `f` is valid (the caller's guarantee); the driver returns a NUL-terminated name
    // that lives as long as the function's module.
    match unsafe { sys::cuFuncGetName(&mut p, f) } {
        sys::CUresult::CUDA_SUCCESS if !p.is_null() => unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned(),
        _ => "?".into(),
    }
}
