//! The float layers' contract: shapes, dtypes, typed errors, empty batches.
//! Bit comparison with `nn.Linear` / `SwitchLinear` is the oracle's job
//! (`float/*` cases).

mod checkpoint_support;

use checkpoint_support::normal_as;
use layers::dense::{Linear, SwitchLinear};
use layers::quantized::{LayerError, PayloadError};
use mlx_rs::{Array, Dtype};

#[test]
fn linear_shapes_dtypes_and_errors() {
    let l = Linear::new(
        normal_as(&[8, 16], 1, Dtype::Bfloat16),
        Some(normal_as(&[8], 2, Dtype::Bfloat16)),
    )
    .unwrap();
    let y = l
        .forward(&normal_as(&[3, 2, 16], 3, Dtype::Bfloat16))
        .unwrap();
    assert_eq!((y.shape(), y.dtype()), (&[3, 2, 8][..], Dtype::Bfloat16));
    // Empty batch: the empty result, no kernel.
    let e = l.forward(&normal_as(&[0, 16], 3, Dtype::Float32)).unwrap();
    assert_eq!((e.shape(), e.dtype()), (&[0, 8][..], Dtype::Float32));
    e.eval().unwrap();
    assert!(matches!(
        l.forward(&normal_as(&[2, 15], 3, Dtype::Bfloat16)),
        Err(LayerError::InputShape { .. })
    ));
    // An integer weight is promoted with x, as the reference's matmul does.
    let ints = Linear::new(Array::from_slice(&[1u32; 8], &[4, 2]), None).unwrap();
    let y = ints
        .forward(&normal_as(&[3, 2], 3, Dtype::Bfloat16))
        .unwrap();
    assert_eq!((y.shape(), y.dtype()), (&[3, 4][..], Dtype::Bfloat16));
    // Biases addmm broadcasts to the output; one that would widen it is refused.
    for (bias, ok) in [
        (&[][..], true),
        (&[1], true),
        (&[1, 8], true),
        (&[3, 8], true),
        (&[2, 1, 8], false),
    ] {
        let l = Linear::new(
            normal_as(&[8, 16], 1, Dtype::Float32),
            Some(normal_as(bias, 2, Dtype::Float32)),
        )
        .unwrap();
        let y = l.forward(&normal_as(&[3, 16], 3, Dtype::Float32));
        match y {
            Ok(y) => assert!(ok && y.shape() == [3, 8], "{bias:?}"),
            Err(e) => assert!(
                !ok && matches!(e, LayerError::Payload(PayloadError::BiasShape { .. })),
                "{bias:?}: {e}"
            ),
        }
    }
    assert!(matches!(
        Linear::new(normal_as(&[8], 1, Dtype::Float32), None),
        Err(LayerError::FloatWeight { .. })
    ));
    assert!(matches!(
        Linear::new(
            normal_as(&[8, 16], 1, Dtype::Float32),
            Some(normal_as(&[7], 1, Dtype::Float32))
        ),
        Err(LayerError::Payload(PayloadError::BiasShape { .. }))
    ));
}

#[test]
fn switch_linear_shapes_and_errors() {
    let l = SwitchLinear::new(
        normal_as(&[4, 8, 16], 1, Dtype::Float32),
        Some(normal_as(&[4, 8], 2, Dtype::Float32)),
    )
    .unwrap();
    let x = normal_as(&[2, 3, 1, 1, 16], 3, Dtype::Float32);
    let idx = Array::from_slice(&[0u32, 3, 1, 2, 2, 0, 3, 3, 1, 0, 2, 1], &[2, 3, 2]);
    let y = l.forward(&x, &idx, false).unwrap();
    assert_eq!(y.shape(), &[2, 3, 2, 1, 8]);
    let bad = Array::from_slice(&[0u32, 4], &[1, 2]);
    assert!(matches!(
        l.forward(&normal_as(&[1, 1, 1, 16], 3, Dtype::Float32), &bad, false),
        Err(LayerError::ExpertIndexOutOfRange { index: 4, .. })
    ));
    let floats = Array::from_slice(&[0.0f32, 1.0], &[1, 2]);
    assert!(matches!(
        l.forward(&x, &floats, false),
        Err(LayerError::IndicesDtype { .. })
    ));
    // Empty batch: the empty array of the broadcast shape.
    let e = l
        .forward(
            &normal_as(&[0, 3, 1, 1, 16], 3, Dtype::Float32),
            &Array::from_slice::<u32>(&[], &[0, 3, 2]),
            false,
        )
        .unwrap();
    assert_eq!(e.shape(), &[0, 3, 2, 1, 8]);
    e.eval().unwrap();
    // M = 0 with real expert ids: they are still range-checked, not against 1.
    let ids = Array::from_slice(&[0u32, 3, 1, 2, 2, 0], &[2, 3]);
    let m0 = l
        .forward(&normal_as(&[2, 3, 0, 16], 3, Dtype::Float32), &ids, false)
        .unwrap();
    assert_eq!(m0.shape(), &[2, 3, 0, 8]);
    let bad_ids = Array::from_slice(&[0u32, 4, 1, 2, 2, 0], &[2, 3]);
    assert!(matches!(
        l.forward(
            &normal_as(&[2, 3, 0, 16], 3, Dtype::Float32),
            &bad_ids,
            false
        ),
        Err(LayerError::ExpertIndexOutOfRange { index: 4, .. })
    ));
    assert!(matches!(
        SwitchLinear::new(normal_as(&[8, 16], 1, Dtype::Float32), None),
        Err(LayerError::FloatWeight { .. })
    ));
}
