//! `/ready` claims readiness only once a worker has passed a health check: workers start
//! healthy so that routing need not wait for the first round, but a pod that reported Ready
//! before any worker was seen would join its Service with nothing behind it.

use kvroute::policy::PolicyKind;

use crate::support::*;

async fn ready_status(c: &reqwest::Client, addr: std::net::SocketAddr) -> u16 {
    c.get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn ready_waits_for_a_passed_health_check() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.health_status = 503);
    // A threshold no test reaches keeps the failing worker "healthy" (routable): only the
    // missing passed check can keep `/ready` at 503.
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        "[health]\ninterval_s = 0.05\nunhealthy_threshold = 1000000",
    )
    .await;
    let c = client();
    let w0 = r.state.fleet.get("w0").unwrap();
    assert!(w0.is_healthy() && !w0.models().is_empty());
    // Several rounds of failed checks have run by the time /ready is asked again.
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        assert_eq!(
            ready_status(&c, r.addr).await,
            503,
            "not ready before a passed check"
        );
    }
    b.set(|x| x.health_status = 200);
    assert!(
        eventually(|| w0.is_verified()).await,
        "a passed check verifies the worker"
    );
    assert_eq!(ready_status(&c, r.addr).await, 200);
    r.shutdown().await;
}
