//! Cluster-occupancy series: how much of a cluster was busy, minute by minute. Philly's
//! node series (Hu et al., via HeliosArtifact) and the per-VC GPU series of SenseTime's
//! Earth cluster (Helios, SC '21).

use serde::Serialize;

use crate::philly::parse_timestamp;
use crate::table::{Bad, Col, Table, malformed};
use crate::{DatasetError, ParseReport};

const PHILLY_HEADER: &str = "time,active,total";
const HELIOS_HEADER: &str = "time,total_job_num,running_job_num,pending_job_num,\
                             total_gpujob_num,running_gpujob_num,pending_gpujob_num,\
                             total_gpu_num,running_gpu_num,pending_gpu_num,idle_gpu_num,\
                             gpu_utilization,...";
const EXPECTED: &str = "`time,active,total` (Philly nodes) or Helios' \
                        `time,...,total_gpu_num,running_gpu_num,...` (GPUs)";
/// Helios' count columns besides the two kept: validated as non-negative integers.
const HELIOS_COUNTS: [&str; 19] = [
    "total_job_num",
    "running_job_num",
    "pending_job_num",
    "total_gpujob_num",
    "running_gpujob_num",
    "pending_gpujob_num",
    "pending_gpu_num",
    "idle_gpu_num",
    "running_gpu_num_noless_8",
    "running_gpu_num_less_8",
    "pending_gpu_num_noless_8",
    "pending_gpu_num_less_8",
    "total_gpu_num_noless_8",
    "total_gpu_num_less_8",
    "running_job_num_noless_8",
    "running_job_num_less_8",
    "pending_job_num_noless_8",
    "pending_job_num_less_8",
    "total_job_num_noless_8",
];

/// What a series counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OccupancyUnit {
    Nodes,
    Gpus,
}

/// One sample: at `time` (Unix seconds, UTC), `active` of `total` units were busy.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OccupancyPoint {
    pub time: i64,
    pub active: u32,
    pub total: u32,
}

/// A time series of occupancy, strictly increasing in time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OccupancySeries {
    pub unit: OccupancyUnit,
    pub points: Vec<OccupancyPoint>,
}

impl OccupancySeries {
    /// Mean of `active / total` over the points with a non-zero total; `None` if none.
    pub fn mean_utilisation(&self) -> Option<f64> {
        let ratios: Vec<f64> = self
            .points
            .iter()
            .filter(|p| p.total > 0)
            .map(|p| f64::from(p.active) / f64::from(p.total))
            .collect();
        (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64)
    }
}

/// Parses an occupancy series, told apart by the header:
/// - Philly's `philly_node_sequence.csv` (`time,active,total`): nodes;
/// - a Helios `cluster_sequence_vc.csv` (decompressed): GPUs, `active` =
///   `running_gpu_num`, `total` = `total_gpu_num`; its other counts are validated as
///   non-negative integers and `gpu_utilization` as a fraction in 0..=1, but not kept.
///
/// Times are `YYYY-MM-DD HH:MM:SS`, UTC. Skipped rows: an unreadable time or count,
/// `active` above `total`, a time not after the previous kept row's (series must be
/// strictly increasing; rows are not reordered).
pub fn parse_occupancy(
    name: &str,
    text: &str,
) -> Result<(OccupancySeries, ParseReport), DatasetError> {
    let table = Table::open(name, text, EXPECTED)?;
    let time = table.column("time", EXPECTED)?;
    let (unit, active, total, extra) = if table.has("active") {
        (
            OccupancyUnit::Nodes,
            table.column("active", PHILLY_HEADER)?,
            table.column("total", PHILLY_HEADER)?,
            None,
        )
    } else if table.has("running_gpu_num") {
        let counts = HELIOS_COUNTS
            .iter()
            .map(|c| table.column(c, HELIOS_HEADER))
            .collect::<Result<Vec<Col>, _>>()?;
        let utilisation = table.column("gpu_utilization", HELIOS_HEADER)?;
        (
            OccupancyUnit::Gpus,
            table.column("running_gpu_num", HELIOS_HEADER)?,
            table.column("total_gpu_num", HELIOS_HEADER)?,
            Some((counts, utilisation)),
        )
    } else {
        return Err(malformed(
            name,
            1,
            "header",
            format!(
                "unrecognised header `{}`; expected {EXPECTED}",
                table.header_line()
            ),
        ));
    };
    let mut report = ParseReport::new(name);
    let mut points: Vec<OccupancyPoint> = Vec::new();
    table.for_each_row(&mut report, |row| {
        let t = parse_timestamp(row.text(time)?).map_err(|b| Bad::new("time", b.reason))?;
        let a: u32 = row.uint(active)?;
        let n: u32 = row.uint(total)?;
        if a > n {
            return Err(Bad::new(
                active.name,
                format!("{a} busy exceeds the total {n}"),
            ));
        }
        if let Some((counts, utilisation)) = &extra {
            for &c in counts {
                let _: u32 = row.uint(c)?;
            }
            let u = row.seconds(*utilisation)?;
            if u > 1.0 {
                return Err(Bad::new(utilisation.name, format!("{u} is above 1")));
            }
        }
        if let Some(last) = points.last()
            && t <= last.time
        {
            return Err(Bad::new(
                "time",
                format!("{} is not after the previous row's time", row.text(time)?),
            ));
        }
        points.push(OccupancyPoint {
            time: t,
            active: a,
            total: n,
        });
        Ok(())
    });
    if points.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((OccupancySeries { unit, points }, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philly_node_series_with_bad_rows_counted() {
        let text = "time,active,total
2017-10-03 00:00:00,312,420
2017-10-03 00:01:00,309,420
2017-10-03 00:01:00,310,420
2017-10-03 00:00:30,310,420
2017-10-03 00:02:00,421,420
2017-10-03 00:02:00,x,420
2017-10-03 25:02:00,1,420
2017-10-03 00:03:00,0,420
";
        let (series, report) = parse_occupancy("philly_node_sequence.csv", text).unwrap();
        assert_eq!(series.unit, OccupancyUnit::Nodes);
        let t0 = 1_506_988_800; // 2017-10-03 00:00:00 UTC
        assert_eq!(
            series.points,
            vec![
                OccupancyPoint {
                    time: t0,
                    active: 312,
                    total: 420
                },
                OccupancyPoint {
                    time: t0 + 60,
                    active: 309,
                    total: 420
                },
                OccupancyPoint {
                    time: t0 + 180,
                    active: 0,
                    total: 420
                },
            ]
        );
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (4, "time"),
                (5, "time"),
                (6, "active"),
                (7, "active"),
                (8, "time")
            ]
        );
        assert!(report.skipped[0].reason.contains("not after"));
        assert!(report.skipped[2].reason.contains("exceeds"));
        let mean = series.mean_utilisation().unwrap();
        assert!((mean - (312.0 + 309.0) / 420.0 / 3.0).abs() < 1e-12);
    }

    const HELIOS: &str = "time,total_job_num,running_job_num,pending_job_num,total_gpujob_num,running_gpujob_num,pending_gpujob_num,total_gpu_num,running_gpu_num,pending_gpu_num,idle_gpu_num,gpu_utilization,running_gpu_num_noless_8,running_gpu_num_less_8,pending_gpu_num_noless_8,pending_gpu_num_less_8,total_gpu_num_noless_8,total_gpu_num_less_8,running_job_num_noless_8,running_job_num_less_8,pending_job_num_noless_8,pending_job_num_less_8,total_job_num_noless_8,total_job_num_less_8
2020-05-01 00:00:00,11,11,0,11,11,0,64,59,0,5,0.922,48,11,0,0,48,11,5,6,0,0,5,6
2020-05-01 00:01:00,11,11,0,11,11,0,64,59,0,5,1.922,48,11,0,0,48,11,5,6,0,0,5,6
2020-05-01 00:02:00,11,11,0,11,11,0,64,59,-1,5,0.922,48,11,0,0,48,11,5,6,0,0,5,6
2020-05-01 00:03:00,11,11,0,11,11,0,64,60,0,4,0.938,48,12,0,0,48,12,5,7,0,0,5,7
";

    #[test]
    fn helios_vc_series_counts_gpus() {
        let (series, report) = parse_occupancy("cluster_sequence_vc.csv", HELIOS).unwrap();
        assert_eq!(series.unit, OccupancyUnit::Gpus);
        let got: Vec<_> = series.points.iter().map(|p| (p.active, p.total)).collect();
        assert_eq!(got, vec![(59, 64), (60, 64)]);
        assert_eq!(series.points[1].time - series.points[0].time, 180);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(got, vec![(3, "gpu_utilization"), (4, "pending_gpu_num")]);
    }

    #[test]
    fn unknown_or_incomplete_headers_are_errors() {
        let err = parse_occupancy("x.csv", "time,busy,total\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. } if file == "x.csv" && field == "header"),
            "{err}"
        );
        let err = parse_occupancy("y.csv", "time,running_gpu_num,total_gpu_num\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "total_job_num"),
            "{err}"
        );
        let err = parse_occupancy("z.csv", "active,total\n1,2\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "time"),
            "{err}"
        );
        let err = parse_occupancy("n.csv", "time,active,total\nx,1,2\n").unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }
}
