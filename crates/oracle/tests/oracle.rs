//! The oracle's own contract: transfer keeps every bit, Python errors come
//! back with their traceback, the process maps one libmlx.

use oracle::{compare, Arg, Comparison, DType, HostTensor, Oracle, OracleError, Value};

fn tensor(dtype: DType, shape: &[usize], seed: u8) -> HostTensor {
    let n = shape.iter().product::<usize>() * dtype.size();
    let mut bytes: Vec<u8> = (0..n)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect();
    if dtype == DType::Bool {
        bytes.iter_mut().for_each(|b| *b &= 1);
    }
    HostTensor::new(dtype, shape.to_vec(), bytes).unwrap()
}

#[test]
fn every_dtype_round_trips_bit_for_bit_with_its_shape() {
    let oracle = Oracle::start().unwrap();
    for dtype in [
        DType::Bool,
        DType::Int32,
        DType::Uint32,
        DType::Int64,
        DType::Float16,
        DType::Bfloat16,
        DType::Float32,
        DType::Uint8,
    ] {
        for shape in [vec![], vec![5], vec![2, 3, 4]] {
            let t = tensor(dtype, &shape, 11);
            let back = oracle
                .call("roundtrip", "echo", &[Arg::from(t.clone())], &[])
                .unwrap();
            let back = back.tensor().expect("a tensor");
            assert_eq!(compare(&back, &t), Comparison::Equal, "{dtype:?} {shape:?}");
        }
    }
}

#[test]
fn mlx_rs_arrays_round_trip_through_the_host() {
    let t = tensor(DType::Bfloat16, &[3, 7], 3);
    let back = HostTensor::from_array(&t.to_array()).unwrap();
    assert_eq!(back, t);
}

#[test]
fn scalars_lists_and_dicts_come_back_typed() {
    let oracle = Oracle::start().unwrap();
    let v = oracle
        .call(
            "scalars",
            "echo",
            &[Arg::List(vec![
                Arg::Int(3),
                Arg::Float(0.5),
                Arg::Bool(true),
                Arg::None,
            ])],
            &[],
        )
        .unwrap();
    let items = v.into_list().unwrap();
    assert!(
        matches!(items[..], [Value::Int(3), Value::Float(f), Value::Bool(true), Value::None] if f == 0.5)
    );
}

#[test]
fn python_exceptions_carry_traceback_and_case_name() {
    let oracle = Oracle::start().unwrap();
    let err = oracle
        .call(
            "family/case-7",
            "raise_value_error",
            &[Arg::from("bad group_size")],
            &[],
        )
        .unwrap_err();
    let OracleError::Python {
        case, traceback, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(case, "family/case-7");
    assert!(traceback.contains("Traceback"), "{traceback}");
    assert!(
        traceback.contains("ValueError: bad group_size"),
        "{traceback}"
    );
    assert!(err.to_string().contains("family/case-7"));
}

#[test]
fn exactly_one_libmlx_is_mapped_and_versions_agree() {
    let oracle = Oracle::start().unwrap();
    let set = oracle::guards::mapped_libmlx().unwrap();
    assert_eq!(set.len(), 1, "{set:?}");
    assert_eq!(oracle.info().mlx_version, mlx_sys::LINKED_MLX_VERSION);
    assert!(oracle::guards::check_versions("0.0.0-not-linked").is_err());
}
