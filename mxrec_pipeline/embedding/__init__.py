"""TPUEmbedding's mid-level API (tf.tpu.experimental.embedding) on the sparse core.

Port a TPUEmbedding training loop by changing the import:

  from mxrec_pipeline import embedding as tpu_embedding   # was tf.tpu.experimental.embedding
  table = tpu_embedding.TableConfig(vocabulary_size=100_000, dim=16, name="movie")
  feature_config = {"item_id": tpu_embedding.FeatureConfig(table=table),
                    "history": tpu_embedding.FeatureConfig(table=table)}
  with strategy.scope():
    embedding = tpu_embedding.TPUEmbedding(feature_config, tpu_embedding.Adam(0.01))

`vocabulary_size` is the table's device capacity (any int64 id may be looked
up, at most that many distinct ones are held). Modules: `config` (TableConfig,
FeatureConfig), `optimizers` (SGD, Adagrad, Adam), `shapes` (output-shape
rules), `lookup` (ids -> activations; combiners in core/combiner.py),
`embedding` (Embedding). See docs/tpu-embedding.md.
"""

from mxrec_pipeline.embedding.config import FeatureConfig, TableConfig
from mxrec_pipeline.embedding.embedding import Embedding, TPUEmbedding
from mxrec_pipeline.embedding.optimizers import SGD, Adagrad, Adam

__all__ = ["Adagrad", "Adam", "Embedding", "FeatureConfig", "SGD", "TPUEmbedding", "TableConfig"]
